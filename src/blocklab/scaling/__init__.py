"""Scaling ladders: each architecture trained at several sizes on the same tokens, loss fitted against
parameters, and the papers' headline numbers ("x% fewer parameters", "y% less data") read off the fits
with intervals over seeds.

- rungs: what a ladder is (rungs, tokens per run, learning-rate rule) and each rung's steps;
- ladder_files: a ladder as YAML (the shipped ones in blocklab/recipes/ladders, or the user's), checked;
- ladders: the shipped ladders by name, and a ladder's runs;
- overrides: the user's training config and key=value overrides over a ladder;
- orchestrate: training a ladder, all at once or a piece at a time within minutes, and the store's runs
  checked against the configs this ladder gives them;
- outputs: every path the command writes, checked before anything trains;
- fit: power laws, their lack-of-fit test, and the parameter and data equivalences;
- judge: the ladder's measurements, the equivalences per seed with t-intervals, the headline claims'
  verdicts;
- report: the markdown and HTML report with the loss-against-parameters figure.
"""

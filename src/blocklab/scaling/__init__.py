"""Scaling ladders: each architecture trained at several sizes on the same tokens, loss fitted against
parameters, and the papers' headline numbers ("x% fewer parameters", "y% less data") read off the fits
with intervals over seeds.

- ladders: the ladders (rungs, budget, learning-rate rule) and their runs;
- orchestrate: training a ladder, all at once or a piece at a time within minutes;
- fit: power laws, their lack-of-fit test, and the parameter and data equivalences;
- judge: the ladder's measurements, the equivalences per seed with t-intervals, the headline claims'
  verdicts;
- report: the markdown and HTML report with the loss-against-parameters figure.
"""

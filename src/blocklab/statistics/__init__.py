"""The statistics blocklab judges with: the papers' claims as data, paired seed differences and
their intervals, verdicts, and the unigram plateau a run must leave."""

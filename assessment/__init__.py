"""The course's assessment: the notebook learners hand in, and the grader an instructor runs on a class.

- ``assessment.ipynb``: the instructor edition (solutions, hidden tests, rubric); ``make release``
  writes the learner edition.
- ``settings``: batch, epochs, target; ``criteria``: what is graded, as per-rank probes and verdicts.
- ``grade``: ``make grade SUBMISSIONS=folder``; it uses ``submission`` (rebuild a notebook around
  the learner's cells), ``sandbox`` (isolation and limits), ``run_notebook`` (execute it, timed) and
  ``probe`` (the learner's functions on fresh ranks).
"""

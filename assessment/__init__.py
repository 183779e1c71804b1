"""The course's assessment: the notebook learners hand in, and what it and the grader's sandbox need.

- ``assessment.ipynb``: the instructor edition (solutions, hidden tests, rubric); ``make release``
  writes the learner bundle, which holds only the learner edition.
- ``settings``: batch, epochs, target; ``criteria``: the criteria, their points and feedback;
  ``job``: the learner's torchrun script run on a tiny problem (in the sandbox) and judged (in the
  grader, or in the notebook's check cell); ``run_notebook`` (execute a submission, inside the
  sandbox) and ``supervised`` (what the sandboxed runner and job do before writing their results).
- ``grader``: the instructor's grader (``make grade SUBMISSIONS=folder``), a package of its own that
  never goes into the learner bundle nor into the sandbox's view.
"""

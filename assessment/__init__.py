"""The course's assessment: the notebook learners hand in, and the grader an instructor runs on a class.

- ``assessment.ipynb``: the instructor edition (solutions, hidden tests, rubric); ``make release``
  writes the learner bundle, which holds only the learner edition.
- ``settings``: batch, epochs, target; ``criteria``: the criteria, their points and feedback;
  ``job``: the learner's torchrun script run on a tiny problem (in the sandbox) and judged (in the
  grader, or in the notebook's check cell).
- ``grade``: ``make grade SUBMISSIONS=folder``; it uses ``submission`` (validate a notebook and rebuild
  it around the learner's cells), ``sandbox`` (the bubblewrap boundary and limits), ``cgroups`` (the
  whole-submission caps), ``run_notebook`` (execute it), ``supervised`` (what the sandboxed runner and
  job do before writing their results), ``judging`` (everything that reads a submission's files, in a
  limited child process) and ``model_file`` (saved models, loaded as untrusted input).
"""

"""The course's assessment: the notebook learners hand in, and the grader an instructor runs on a class.

- ``assessment.ipynb``: the instructor edition (solutions, hidden tests, rubric); ``make release``
  writes the learner bundle, which holds only the learner edition.
- ``settings``: batch, epochs, target; ``cgroups``: the whole-submission caps; ``criteria``: what each rank runs for each criterion (in the
  sandbox); ``verdicts``: the judges and the one-process references (in the grader only).
- ``grade``: ``make grade SUBMISSIONS=folder``; it uses ``submission`` (validate a notebook and rebuild
  it around the learner's cells), ``sandbox`` (the bubblewrap boundary and limits), ``run_notebook``
  (execute it), ``probe`` (the learner's functions on fresh ranks) and ``model_file`` (the saved model,
  loaded as untrusted input).
"""

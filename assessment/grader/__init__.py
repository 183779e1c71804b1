"""The assessment's grader and everything only it needs: ``grade`` (the batch: one row per submission),
``submission`` (the handed-in notebook read back into the instructor's), ``sandbox`` and ``cgroups``
(where a submission runs), ``judging`` (what came back, judged in a limited child process),
``model_file`` (untrusted checkpoints loaded safely). Run as ``python -m assessment.grader.grade``.

This package is never in the learner bundle nor in the grader's sandbox view (``tooling.release``
leaves the folder out); what learners and the sandbox need of the assessment lives one folder up."""

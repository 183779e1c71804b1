"""Course tooling, run by make, the tests and the grader, never by a lab's cells: ``release`` (the learner
edition, the learner bundle, a learner's workspace) and ``course`` (notebooks run headless, the course
map and index). It ships in the learner bundle, where ``make lab`` and ``make course`` need it."""

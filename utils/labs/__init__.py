"""One module per lab: that lab's measurements, figures and printed verdicts, the code its cells call but
do not teach (``labs/NN_*.ipynb`` imports ``utils.labs.labNN as lab``). Everything about lab N is its
notebook, this module, its check (``utils.checks.labNN``), its deck (``slides/NN_*.md``) and its tests
(``tests/library/test_labNN_topic.py``, lab 08's ``test_lab08.py``, lab 05's in ``test_ddp.py``; ``tests/test_checks_labNN.py``). Lab 01 needs none: its cells call the
learners' library directly.

  lab02  one GPU: recorded GPU runs, the pinned-memory loop, the throughput table
  lab03  collectives: the sweep's tables, figures and findings
  lab04  DDP: a DDP step's cost against its prediction and against one process
  lab05  DDP from scratch: the wrapper against one process on the whole batch
  lab06  a realistic model: data loading, scaling over workers, WideResNet settings on a GPU
  lab07  batch size: short runs, noise scale, critical batch, learning-rate rules, loss landscapes
  lab08  beyond synchronous SGD: model averaging and local SGD against one worker, every method side by side
"""

"""Tests of the TensorFlow backend.

TensorFlow fixes a process's threading at its first Session, so every in-process run in
the test process uses `IN_PROCESS`; other settings run in worker processes. One inter-op
thread runs nodes one at a time, as the calibration run does: a trace event never
overlaps another, however loaded the machine (with TensorFlow's default of one inter-op
thread per core, CI's load made independent nodes overlap in every timed step, and the
cost model rightly dropped them).
"""

from schedlab.tf.runtime import TFThreads

IN_PROCESS = TFThreads(intra_op=0, inter_op=1)

"""TensorFlow as a second real backend: the built-in workloads written in TensorFlow ops,
their training step as a TF1-style graph, and that graph captured as a schedlab Graph.

Nothing here imports TensorFlow at import time: `schedlab.tf.runtime.import_tensorflow`
does, once, with the settings TF fixes at start-up. TensorFlow comes with the `tf` extra
(`pip install 'schedlab[tf]'`); `make venv` installs it.
"""

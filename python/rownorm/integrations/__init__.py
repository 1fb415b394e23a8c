"""Integrations of rownorm with other libraries, each imported on its own (none is imported by
``import rownorm``, and none needs its library to be importable until it is used):

* :mod:`rownorm.integrations.transformers`: swap the normalization modules of a Hugging Face
  ``transformers`` model (or of its modeling classes, before ``from_pretrained``) for rownorm's.
* :mod:`rownorm.integrations.hf_kernels`: rownorm's RMS norm as the "RMSNorm" layer of Hugging
  Face's ``kernels`` library (``kernelize`` with :func:`~rownorm.integrations.hf_kernels.
  kernel_mapping`).
"""

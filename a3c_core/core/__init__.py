"""Hogwild core: shared params/optimizers, returns, preprocessing (Cython, nogil).

Every kernel has a plain-numpy twin in :mod:`a3c_core.core.ref`.
"""
from a3c_core.core.optim import OPTIMIZERS, Adam, Optimizer, RMSProp, make_optimizer
from a3c_core.core.preprocess import Preprocessor, preprocess_frame
from a3c_core.core.returns import discounted_returns, gae
from a3c_core.core.shared import SharedState, clip_grad_norm, sync_params

__all__ = ["sync_params", "clip_grad_norm", "SharedState", "Optimizer", "RMSProp", "Adam",
           "make_optimizer", "OPTIMIZERS", "discounted_returns", "gae",
           "Preprocessor", "preprocess_frame"]

"""Ops that are plain array arithmetic, the same in every array module (NumPy, CuPy)."""

import numpy as np


class ArrayAlgebra:
    @staticmethod
    def add(a, b):
        return a + b

    @staticmethod
    def mul(a, b):
        return a * b

    @staticmethod
    def scale(a, s: float):
        return a * np.float32(s)

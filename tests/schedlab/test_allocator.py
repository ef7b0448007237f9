from __future__ import annotations

import platform

import pytest

from schedlab.allocator import tune_malloc


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_tune_malloc_applies_on_glibc() -> None:
    assert tune_malloc() is True

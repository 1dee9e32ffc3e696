"""Each test module and each test starts from the same global generator state.

nn.Module initialisation draws from torch's global generator, so without this a test's weights (and any margin it
checks) would hang on which tests ran before it and in what order. The module-scoped seed covers module fixtures,
which pytest sets up before any function-scoped one.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _seed_global_generator_per_module():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _seed_global_generator():
    torch.manual_seed(0)

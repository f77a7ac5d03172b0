"""optireduce: Transpose AllReduce with randomized Hadamard encoding and bounded-time delivery,
from Python. `optireduce.torch` holds the PyTorch DDP communication hook."""

from ._library import load_library, library_path  # noqa: F401
from .comm import Communicator, Stats  # noqa: F401
from .errors import OptiReduceError  # noqa: F401
from .options import make_options, describe  # noqa: F401

__version__ = "0.1.0"

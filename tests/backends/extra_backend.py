"""A backend that exists only in a test: a DDP subclass that declares one knob of its own. test_contract.py registers
it (nothing else) to prove that a backend added to the registry alone is planned, offered in --help and checked by the
contract."""
from backends.base import COMMON_KNOBS
from backends.ddp import DDP
from bench.core.knobs import Knob

EXTRA_BUCKETS = Knob("extra_buckets", "buckets of the extra backend (a knob that exists in a test only)", int, low=0)


class Extra(DDP):
    knobs = (EXTRA_BUCKETS, *COMMON_KNOBS)

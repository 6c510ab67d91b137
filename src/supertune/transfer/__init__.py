"""What a site sends: its model or its change from the round's global model, encoded (fp32, bf16,
fp16, blockwise int8) into a transfer package with a manifest, with error feedback kept at the site
and the change clipped and noised for differential privacy when asked; and the package read back a
slice at a time. See codec.py, privacy.py and package.py. Secure aggregation's masked sum of the
sites' changes is secure_sum.py (the integers and their bounds), secure_masks.py (the pairwise
masks; imported by name, as it needs the `cryptography` package) and secure_upload.py (an upload as
a file, and their sum)."""

from .codec import CODECS, Codec
from .package import (
    PACKAGE_MANIFEST,
    Package,
    PackageWeights,
    package_problems,
    read_package,
    write_package,
)
from .privacy import ChangeNoise

__all__ = [
    "CODECS",
    "ChangeNoise",
    "Codec",
    "PACKAGE_MANIFEST",
    "Package",
    "PackageWeights",
    "package_problems",
    "read_package",
    "write_package",
]

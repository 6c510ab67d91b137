"""Cluster profiles: the hardware, scheduler defaults, software stack and environment of each site.

Profiles are YAML data (shipped in `profiles/`, overridable in `user_profile_dir()`); importing this
package does not import torch.
"""

from .registry import (
    ProfileError,
    ProfileSources,
    list_profiles,
    load_profile,
    load_profile_with_sources,
    profile_names,
    profile_sources,
    shipped_profile_dir,
    user_profile_dir,
)
from .schema import ClusterProfile, ContainerSpec

__all__ = [
    "ClusterProfile",
    "ContainerSpec",
    "ProfileError",
    "ProfileSources",
    "list_profiles",
    "load_profile",
    "load_profile_with_sources",
    "profile_names",
    "profile_sources",
    "shipped_profile_dir",
    "user_profile_dir",
]

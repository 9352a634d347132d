"""The profile stage: where the time of a fused build goes and what to fuse next.

`measure` times each kernel of the unfused and fused builds and ranks the candidates (`profile`); `roofline` is
the traffic model (bytes moved, the memory-bound floor); `html` renders the report page. `tvm_fusion.profile` is
callable as `profile`.
"""

from tvm_fusion.profile.measure import (SCHEMA_VERSION, BuildProfile, Candidate, GroupProfile, ProfileReport, Site,
                                        profile)

__all__ = ["ProfileReport", "profile", "Site", "GroupProfile", "Candidate", "BuildProfile", "SCHEMA_VERSION"]

"""Local differential privacy's public forms: ``dpsql.local.randomized_response`` and its
counting, as the docs show them. The mechanism's math lives in
``dpsql.mechanisms.randomized_response``; this module is its documented import path.

>>> from dpsql.local import randomized_response
>>> from dpsql.mechanisms.noise import SeededSource
>>> randomized_response(["a"], epsilon=30, domain=["a", "b"], source=SeededSource(0))
['a']
"""

from dpsql.mechanisms.randomized_response import (
    debiased_count,
    debiased_variance,
    keep_probability,
    noise_variance_after_debiasing,
    other_probability,
    randomized_response,
)

__all__ = ["randomized_response", "keep_probability", "other_probability", "debiased_count", "debiased_variance",
           "noise_variance_after_debiasing"]

"""Every threshold a finding uses, in one place, each with the reason for its value.

Changing a value here changes what tracewhy reports; tests pin behaviour on both sides of each.
"""

from __future__ import annotations

from typing import Final

# --- trust checks --------------------------------------------------------------------------
#: Fewer steady steps than this and percentiles are anecdotes: p90 of two values is an
#: interpolation, not a distribution.
MIN_STEADY_STEPS: Final = 3

"""The service's kernel: what every slice shares and no slice owns.

The principal (`Principal`) and its generic facts bag (`PrincipalFacts`),
the directory resolving a passport to a principal from the facts the slices
contribute (`PrincipalDirectory`), the error base (`ServiceError`) and the
wire shape of affordances (a mutation's refusal is the engine kit's
`MutationResult`). Nothing here names a slice: a slice
contributes its principal facts from its own ``register``.
"""

from .errors import ConfigurationError, ServiceError
from .principal import FactSource, Principal, PrincipalDirectory, PrincipalFacts
from .wire import Affordance, Info, affordance_list

__all__ = [
    "Affordance",
    "ConfigurationError",
    "FactSource",
    "Info",
    "Principal",
    "PrincipalDirectory",
    "PrincipalFacts",
    "ServiceError",
    "affordance_list",
]

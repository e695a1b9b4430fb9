"""The service's kernel: what every slice shares and no slice owns.

The principal (`Principal`), its generic facts bag (`PrincipalFacts`) and
the passport resolver (`principal_of`), the error base (`ServiceError`) and
the wire shape of affordances (a mutation's refusal is the engine kit's
`MutationResult`). Nothing here names a slice and nothing here is a
registry: a slice registers its principal fact loader and contributes its
scopes with the engine, from its own ``register``.
"""

from .errors import ConfigurationError, ServiceError
from .principal import Principal, PrincipalFacts, principal_of
from .wire import Affordance, Info, affordance_list

__all__ = [
    "Affordance",
    "ConfigurationError",
    "Info",
    "Principal",
    "PrincipalFacts",
    "ServiceError",
    "affordance_list",
    "principal_of",
]

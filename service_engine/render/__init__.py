"""The render runtime's pure core, one concept a module.

* `windows` — window declarations (`Keys`, `Ordered`, `Query`, `WindowSpec`,
  `Emission`);
* `interest` — interest routing (`Interest`, `Route`, `Dirty`, `RenderFrame`);
* `membership` — a window's head and what a pass renders of it;
* `session` — one session's state machine; `paging` — pages behind a window;
* `session_id` — a session's identity; `window_diff` — one window's diff and
  the renders sessions share;
* `deltas` — Reset / Upsert / Remove and the window diff;
* `cohort` — collision-free cohort keys; `cohort_index` — which discovering
  sessions a changed row concerns;
* `plan` — which sessions a frame renders (pure); `report` — `PassReport`;
* `projector` — the projector surface a slice author writes; `sharing` —
  views projected once per declared view key (`SharedViews`);
* `stream` — the subscriber's stream of deltas.

Everything re-exported here is synchronous and free of I/O. Built on it:
`registry` (projectors, sessions, attach / fetch / page, the reads) and
`runtime` (the render loop and its pass).
"""

from __future__ import annotations

from service_engine.render.cohort import (
    CohortKey,
    CohortMismatch,
    CohortPart,
    HasPrincipalId,
    InvalidCohortPart,
    InvalidPrincipalId,
    check_cohort,
    group_by_cohort,
    principal_key,
)
from service_engine.render.deltas import (
    Change,
    Delta,
    KeyText,
    Remove,
    Reset,
    Revision,
    RevisionGap,
    Upsert,
    WindowReplica,
    apply_change,
    decode_key,
    diff_window,
)
from service_engine.render.interest import (
    Dirty,
    Interest,
    InvalidRoute,
    Inverse,
    RenderFrame,
    Route,
    UnknownProjector,
)
from service_engine.render.membership import Membership, PopulateRequired, RenderPlan
from service_engine.render.paging import (
    Appended,
    NoLiveSession,
    NotPageable,
    PageInterrupted,
    PageResult,
    Pages,
    PageTicket,
)
from service_engine.render.projector import (
    Coalesced,
    InvalidProjector,
    MissingRlsApplier,
    PerImpact,
    Populate,
    Projector,
    RlsApplier,
    RlsRegimeMismatch,
    Unrestricted,
    Visibility,
    VisibilityMismatch,
)
from service_engine.render.report import PassReport, PassTally
from service_engine.render.session import (
    DEFAULT_BARRIER_CAPACITY,
    IllegalTransition,
    PrincipalChanged,
    Session,
    SessionState,
    authorize_page,
)
from service_engine.render.session_id import (
    InvalidSessionId,
    SessionId,
    new_session_id,
    parse_session_id,
)
from service_engine.render.sharing import InvalidViewKey, SharedViews, view_key_of
from service_engine.render.windows import (
    Emission,
    InvalidWindow,
    Keys,
    MembershipRule,
    Ordered,
    Population,
    Query,
    WindowSpec,
    keyed,
)

from .table_window import TableWindow

__all__ = [
    "DEFAULT_BARRIER_CAPACITY",
    "Appended",
    "Change",
    "Coalesced",
    "CohortKey",
    "CohortMismatch",
    "CohortPart",
    "Delta",
    "Dirty",
    "Emission",
    "HasPrincipalId",
    "IllegalTransition",
    "Interest",
    "InvalidCohortPart",
    "InvalidPrincipalId",
    "InvalidProjector",
    "InvalidRoute",
    "InvalidSessionId",
    "InvalidViewKey",
    "InvalidWindow",
    "Inverse",
    "KeyText",
    "Keys",
    "Membership",
    "MembershipRule",
    "MissingRlsApplier",
    "NoLiveSession",
    "NotPageable",
    "Ordered",
    "PageInterrupted",
    "PageResult",
    "PageTicket",
    "Pages",
    "PassReport",
    "PassTally",
    "PerImpact",
    "Populate",
    "PopulateRequired",
    "Population",
    "PrincipalChanged",
    "Projector",
    "Query",
    "Remove",
    "RenderFrame",
    "RenderPlan",
    "Reset",
    "Revision",
    "RevisionGap",
    "RlsApplier",
    "RlsRegimeMismatch",
    "Route",
    "Session",
    "SessionId",
    "SessionState",
    "SharedViews",
    "TableWindow",
    "UnknownProjector",
    "Unrestricted",
    "Upsert",
    "Visibility",
    "VisibilityMismatch",
    "WindowReplica",
    "WindowSpec",
    "apply_change",
    "authorize_page",
    "check_cohort",
    "decode_key",
    "diff_window",
    "group_by_cohort",
    "keyed",
    "new_session_id",
    "parse_session_id",
    "principal_key",
    "view_key_of",
]

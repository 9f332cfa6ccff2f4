"""The vocabulary every stage shares.

`schema`: what one captured tensor is (`Record`, the enums of its fields, the step file's
columns); `naming`: entry names derived from a record's fields and the canonical op of every
framework API (tables in `tables/`); `layers`: the constructor settings that decide a layer's
numerics; `arguments`: which arguments of a call are recorded, under which keys (the rule the
adapters and the msprobe reader share); `precision`: which float dtype rounds more coarsely;
`environment`: the numerics environment variables a run records, secret values redacted.

Imports: precdbg.errors
"""
from __future__ import annotations

from .schema import (COMPUTED_ROLES, DTYPE_VALUE, INVENTORY_ROLES, NO_PRODUCER, READ_ROLES,
                     SCHEMA_VERSION, WRITE_ROLES, DataMode, Direction, DtypeName, Level, Phase,
                     Record, RecordKind, Role, SummaryMode, Task)
from .naming import (api_members, canonical_op, framework_table, in_place, inventory_role, operator_api,
                     param_alias, vocabulary, writes_arguments)

__all__ = ["SCHEMA_VERSION", "Record", "Task", "Level", "RecordKind", "Direction", "Role",
           "Phase", "DataMode", "SummaryMode", "DtypeName", "DTYPE_VALUE", "NO_PRODUCER",
           "READ_ROLES", "WRITE_ROLES", "COMPUTED_ROLES", "INVENTORY_ROLES", "canonical_op",
           "api_members", "framework_table", "in_place", "inventory_role", "operator_api", "param_alias",
           "vocabulary", "writes_arguments"]

"""The sparse table's layout, shared by the PS processes, the planner, evaluation and export:
:mod:`~components.table.accessor` (a row's fields as the servers' accessor lays them out, and its text parser),
:mod:`~components.table.sharding` (which server holds an id), :mod:`~components.table.memory` (what its rows cost a
server: the memory plan)."""

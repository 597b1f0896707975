"""The action graph: the kinds registry, Action, the planner, the precision search, memory estimates."""

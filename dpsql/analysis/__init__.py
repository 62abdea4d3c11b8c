"""From a parsed query to a plan: binding, checking, relations, sensitivities and the plan."""

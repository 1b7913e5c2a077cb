"""Every call classified once, before any stage judges it (issue 30).

Pure: a route, a method, a body in; a typed call out (`proxy.classify.calls`). The path was
normalised once by routing (`proxy.classify.paths`); whether an unclassified call may still be relayed
is `proxy.classify.policy`. Tool names follow one rule: `proxy.guards.tool_names`.
"""

"""Tooling that starts, supervises and watches jobs on this machine: the ``bosen`` CLI, the launcher,
local clusters, process supervision, status queries and the ``bosen`` pytest plugin.

None of the shared vocabulary in ``bosen`` (wire, rowmath, config, ...) imports this subpackage; the
server and client libraries do not need it. Import its modules by name (``bosen.jobs.launch``); this
package re-exports nothing.
"""

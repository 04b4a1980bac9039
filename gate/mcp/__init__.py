"""The MCP server (``hitl-gate mcp``): the gate's approvals and questions as tools an
agent host mounts, over stdio or streamable HTTP, built on the official ``mcp`` package: the
tools (tools), what they answer (results), the server and its transports (server) and the
bearer check of the HTTP one (auth). A client of the pipeline API through the SDK
(``gate.sdk``): never gate.core, gate.store, gate.daemon or gate.web."""

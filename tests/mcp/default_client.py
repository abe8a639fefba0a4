"""Drives `kavi mcp` with the official MCP Python SDK's default client (`mcp.Client`).

Usage: default_client.py KAVI WORKSPACE [--client NAME]

Unlike client.py, which opens the older handshake itself, this is what an application gets by
default: `mcp.Client` negotiates the newest protocol version both sides offer. It declares the
elicitation capability, accepts every question kavi asks, calls `write_note` (FILE_WRITE), and
prints one JSON object with the negotiated version, the questions and the call's result.
"""

import asyncio
import json
import os
import sys

from mcp import Client, StdioServerParameters, types
from mcp.client.stdio import get_default_environment


async def main():
    kavi, workspace, *extra = sys.argv[1:]
    questions = []

    async def elicit(context, params):
        questions.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": True})

    # The SDK starts a server with a few variables only; kavi also needs where its keys are.
    keys = {k: v for k, v in os.environ.items() if k == "XDG_CONFIG_HOME"}
    server = StdioServerParameters(
        command=kavi, args=["mcp", *extra], cwd=workspace, env={**get_default_environment(), **keys}
    )
    async with Client(server, elicitation_callback=elicit) as client:
        written = await client.call_tool(
            "write_note", {"title": "from mcp", "body": "written by an agent"}
        )
        print(
            json.dumps(
                {
                    "protocol_version": client.session.protocol_version,
                    "questions": questions,
                    "is_error": bool(written.is_error),
                    "text": [b.text for b in written.content if getattr(b, "type", "") == "text"],
                    "structured": written.structured_content,
                }
            )
        )


asyncio.run(main())

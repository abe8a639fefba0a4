"""Drives `kavi mcp` with the official MCP Python SDK (the `mcp` package from PyPI).

Usage: client.py [--elicit accept|decline|accept-after-editing=FILE] KAVI WORKSPACE [--client NAME]

Lists the tools, calls `word_count` (READ_ONLY) and `write_note` (FILE_WRITE), and prints one
JSON object with what the server answered, for the Rust test to check. With `--elicit`, the
client declares the elicitation capability and answers every question kavi asks its user with
that choice (standing in for the person the client would show it to); the questions are printed
too. `accept-after-editing=FILE` appends a line to FILE before accepting: a skill edited while
its user is being asked.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import get_default_environment, stdio_client


def content_text(result):
    return [block.text for block in result.content if getattr(block, "type", "") == "text"]


async def main():
    args = sys.argv[1:]
    answer = None
    if args[0] == "--elicit":
        answer, args = args[1], args[2:]
    kavi, workspace, *extra = args
    questions = []

    async def elicit(context, params):
        questions.append({"message": params.message, "schema": getattr(params, "requested_schema", None)})
        if answer.startswith("accept-after-editing="):
            with open(answer.split("=", 1)[1], "a") as edited:
                edited.write("\n# edited while its user was asked\n")
            return types.ElicitResult(action="accept", content={"confirm": True})
        if answer == "accept":
            return types.ElicitResult(action="accept", content={"confirm": True})
        return types.ElicitResult(action="decline")

    callback = elicit if answer else None
    # The SDK starts a server with a few variables only; kavi also needs where its keys are
    # (XDG_CONFIG_HOME), which accounts sharing a ledger share.
    keys = {k: v for k, v in os.environ.items() if k == "XDG_CONFIG_HOME"}
    server = StdioServerParameters(
        command=kavi, args=["mcp", *extra], cwd=workspace, env={**get_default_environment(), **keys}
    )
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write, elicitation_callback=callback) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            counted = await session.call_tool("word_count", {"text": "one two three"})
            written = await session.call_tool(
                "write_note", {"title": "from mcp", "body": "written by an agent"}
            )
            bad_input = await session.call_tool("word_count", {"words": 3})
            unknown = await session.call_tool("no_such_skill", {})
            print(
                json.dumps(
                    {
                        "server": init.server_info.name,
                        "questions": questions,
                        "tools": [
                            {
                                "name": tool.name,
                                "read_only": tool.annotations.read_only_hint
                                if tool.annotations
                                else None,
                                "schema": tool.input_schema,
                            }
                            for tool in tools.tools
                        ],
                        "calls": {
                            name: {
                                "is_error": bool(result.is_error),
                                "text": content_text(result),
                                "structured": result.structured_content,
                            }
                            for name, result in [
                                ("word_count", counted),
                                ("write_note", written),
                                ("bad_input", bad_input),
                                ("unknown", unknown),
                            ]
                        },
                    }
                )
            )


asyncio.run(main())

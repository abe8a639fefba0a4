"""Reads kavi's chains as MCP prompts, and calls a skill over a link, with the official MCP
Python SDK's default client (`mcp.Client`, the newest protocol version both sides offer).

Usage: prompts.py KAVI WORKSPACE

Pages through `prompts/list` one prompt a page (the workspace's policies/mcp.toml sets the
page), gets `search_and_summarize` with a query, gets `count_it` without its required
argument and a prompt that does not exist, then calls `find_notes` for a word that only a note
linked out of the workspace holds. Prints one JSON object with all it saw, for the Rust test to check.
"""

import asyncio
import json
import os
import sys

from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment


def error_of(error):
    return {"code": getattr(getattr(error, "error", None), "code", None), "message": str(error)}


async def main():
    kavi, workspace = sys.argv[1:]
    keys = {k: v for k, v in os.environ.items() if k == "XDG_CONFIG_HOME"}
    server = StdioServerParameters(
        command=kavi, args=["mcp"], cwd=workspace, env={**get_default_environment(), **keys}
    )
    async with Client(server) as client:
        pages, cursor = [], None
        while True:
            page = await client.list_prompts(cursor=cursor)
            pages.append(
                {
                    "prompts": [
                        {
                            "name": p.name,
                            "description": p.description,
                            "arguments": [
                                {"name": a.name, "required": a.required} for a in p.arguments or []
                            ],
                        }
                        for p in page.prompts
                    ],
                    "next": page.next_cursor,
                }
            )
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        got = await client.get_prompt("search_and_summarize", {"query": "governed"})
        out = {
            "protocol_version": client.session.protocol_version,
            "prompts_capability": client.server_capabilities.prompts is not None,
            "pages": pages,
            "got": {
                "description": got.description,
                "messages": [{"role": m.role, "text": m.content.text} for m in got.messages],
            },
        }
        for key, name, arguments in [
            ("missing_argument", "count_it", {}),
            ("unknown", "no_such_chain", None),
        ]:
            try:
                await client.get_prompt(name, arguments)
                out[key] = None
            except Exception as error:
                out[key] = error_of(error)
        found = await client.call_tool("find_notes", {"query": "root"})
        out["link"] = {
            "is_error": bool(found.is_error),
            "text": [b.text for b in found.content if getattr(b, "type", "") == "text"],
        }
        print(json.dumps(out))


asyncio.run(main())

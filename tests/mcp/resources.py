"""Reads kavi's execution records and runs as MCP resources with the official MCP Python SDK.

Usage: resources.py legacy|current KAVI WORKSPACE

`legacy` opens the older handshake (`ClientSession.initialize`, 2025-11-25), `current` is what
`mcp.Client` negotiates by default (2026-07-28). Either way the client pages through
`resources/list` by cursor, lists the templates, reads a record by its id and by a prefix of it,
a run, a summary and a resource that does not exist; then subscribes to `kavi://executions`
(`resources/subscribe` on the older version, `subscriptions/listen` on the current one), runs
`kavi skill run word_count` as another process, and waits for what the server says of it. It
prints one JSON object with all it saw, for the Rust test to check.
"""

import asyncio
import json
import os
import subprocess
import sys

from mcp import Client, ClientSession, StdioServerParameters, types
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated

# How long the server may take to tell of a new record.
WAIT = 30


async def pages(list_page):
    """Every page of resources/list, following the cursors."""
    seen, cursor = [], None
    while True:
        page = await list_page(cursor)
        seen.append({"uris": [r.uri for r in page.resources], "next": page.next_cursor})
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor


def text(result):
    return [c.text for c in result.contents]


async def reads(read, first_record, first_run):
    """A record by its id and by a prefix, a run, a summary, and what is not there."""
    record_id = first_record.rsplit("/", 1)[1]
    out = {
        "record": json.loads(text(await read(first_record))[0]),
        "by_prefix": json.loads(text(await read(f"kavi://executions/{record_id[:8]}"))[0]),
        "summary": json.loads(text(await read("kavi://executions"))[0]),
    }
    if first_run:
        out["run"] = json.loads(text(await read(first_run))[0])
    try:
        await read("kavi://executions/ffffffff")
        out["missing"] = None
    except Exception as error:
        out["missing"] = {"code": getattr(getattr(error, "error", None), "code", None), "message": str(error)}
    return out


def run_skill(kavi, workspace):
    """`kavi skill run` in a process of its own, as a person at a terminal would."""
    done = subprocess.run(
        [kavi, "skill", "run", "word_count", "--input", '{"text": "from another process"}'],
        cwd=workspace,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"kavi skill run failed: {done.stdout}{done.stderr}")


def firsts(listed):
    uris = [uri for page in listed for uri in page["uris"]]
    record = next(u for u in uris if u.startswith("kavi://executions/"))
    run = next((u for u in uris if u.startswith("kavi://runs/")), None)
    return record, run


async def legacy(kavi, workspace, server):
    notified = []
    heard = asyncio.Event()

    async def on_message(message):
        if isinstance(message, (types.ResourceUpdatedNotification, types.ResourceListChangedNotification)):
            notified.append({"method": message.method, "uri": getattr(message.params, "uri", None)})
            heard.set()

    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write, message_handler=on_message) as session:
            init = await session.initialize()
            listed = await pages(lambda cursor: session.list_resources(params=types.PaginatedRequestParams(cursor=cursor)))
            templates = await session.list_resource_templates()
            record, run = firsts(listed)
            out = await reads(session.read_resource, record, run)
            await session.subscribe_resource("kavi://executions")
            run_skill(kavi, workspace)
            deadline = asyncio.get_running_loop().time() + WAIT
            updated = {"method": "notifications/resources/updated", "uri": "kavi://executions"}
            list_changed = {"method": "notifications/resources/list_changed", "uri": None}
            while updated not in notified or list_changed not in notified:
                heard.clear()
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    await asyncio.wait_for(heard.wait(), left)
                except TimeoutError:
                    break
            after = await session.list_resources()
            return {
                "protocol_version": init.protocol_version,
                "capabilities": init.capabilities.resources.model_dump(by_alias=True, exclude_none=True),
                "pages": listed,
                "templates": [t.uri_template for t in templates.resource_templates],
                **out,
                "notified": notified,
                "after": [r.uri for r in after.resources],
            }


async def current(kavi, workspace, server):
    async with Client(server) as client:
        listed = await pages(lambda cursor: client.list_resources(cursor=cursor))
        templates = await client.list_resource_templates()
        record, run = firsts(listed)
        out = await reads(client.read_resource, record, run)
        events = []
        async with client.listen(resources_list_changed=True, resource_subscriptions=["kavi://executions"]) as sub:
            honored = sub.honored.model_dump(by_alias=True, exclude_none=True)
            run_skill(kavi, workspace)

            async def until_both():
                async for event in sub:
                    events.append(event)
                    if ResourcesListChanged() in events and ResourceUpdated("kavi://executions") in events:
                        return

            try:
                await asyncio.wait_for(until_both(), WAIT)
            except TimeoutError:
                pass
        after = await client.list_resources()
        return {
            "protocol_version": client.session.protocol_version,
            "pages": listed,
            "templates": [t.uri_template for t in templates.resource_templates],
            **out,
            "honored": honored,
            "events": [type(e).__name__ + (f" {e.uri}" if isinstance(e, ResourceUpdated) else "") for e in events],
            "after": [r.uri for r in after.resources],
        }


async def main():
    mode, kavi, workspace = sys.argv[1:]
    # The SDK starts a server with a few variables only; kavi also needs where its keys and its
    # ledger are, as `kavi skill run` here does.
    passed = {k: v for k, v in os.environ.items() if k == "XDG_CONFIG_HOME" or k.startswith("KAVI_")}
    server = StdioServerParameters(
        command=kavi, args=["mcp"], cwd=workspace, env={**get_default_environment(), **passed}
    )
    seen = await (legacy if mode == "legacy" else current)(kavi, workspace, server)
    print(json.dumps(seen))


asyncio.run(main())

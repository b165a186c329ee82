#!/usr/bin/python3
# Copyright: gatekeeper contributors
"""A TCP proxy on loopback that adds latency: a relay "N ms away".

  delay_proxy.py --listen PORT --target PORT --delay-ms N [--delay-up-ms N] [--log FILE]

Accepts on 127.0.0.1:LISTEN, connects each client to 127.0.0.1:TARGET and
forwards every chunk read in either direction DELAY_MS later (a chunk
read at t is written at t + delay, in order; reading goes on meanwhile,
so this is latency, not a bandwidth limit: a round trip costs 2 x delay).
--delay-up-ms sets the client-to-target direction apart (default: the
same as --delay-ms): a standby's walreceiver behind a proxy with
--delay-ms 1000 --delay-up-ms 0 receives the primary's WAL a second late
and reports what it flushed at once.

Bounded: at most --max-connections at once (more are closed at once),
at most --max-bytes forwarded in all (then it exits), exits after
--lifetime seconds or when its parent goes away.  Logs one line per
connection, and totals at exit (SIGTERM included), to --log: "conn N
open", "conn N close up=BYTES down=BYTES chunks_up=N chunks_down=N",
"exit: N connections, B bytes, chunks_up=N chunks_down=N" (chunks_up
counts the client's writes as they arrived: with the delay far above
the client's own think time, about one per round trip it waits for).
"""

import argparse
import asyncio
import collections
import os
import signal
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument('--listen', type=int, required=True)
ap.add_argument('--target', type=int, required=True)
ap.add_argument('--delay-ms', type=float, required=True)
ap.add_argument('--delay-up-ms', type=float)
ap.add_argument('--log')
ap.add_argument('--max-connections', type=int, default=256)
ap.add_argument('--max-bytes', type=int, default=8 << 30)
ap.add_argument('--lifetime', type=int, default=900)
args = ap.parse_args()

delays = {'down': args.delay_ms / 1000.0,
          'up': (args.delay_up_ms if args.delay_up_ms is not None else args.delay_ms) / 1000.0}
logf = open(args.log, 'a', buffering=1) if args.log else None
state = {'conns': 0, 'open': 0, 'bytes': 0, 'chunks_up': 0, 'chunks_down': 0}
done = None


def log(line):
    if logf:
        logf.write('%.3f %s\n' % (time.time(), line))


async def pump(reader, writer, counter, key):
    """Copy reader to writer, each chunk delayed; returns at EOF."""
    queue = collections.deque()
    more = asyncio.Event()
    eof = False

    async def feed():
        nonlocal eof
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                state['bytes'] += len(data)
                counter[key] += len(data)
                counter['chunks_' + key] += 1
                state['chunks_' + key] += 1
                if state['bytes'] > args.max_bytes:
                    log('max-bytes reached, exiting')
                    done.set()
                    break
                queue.append((time.monotonic() + delays[key], data))
                more.set()
        except (ConnectionError, OSError):
            pass
        eof = True
        more.set()

    feeder = asyncio.ensure_future(feed())
    try:
        while True:
            if not queue:
                if eof:
                    break
                more.clear()
                await more.wait()
                continue
            at, data = queue.popleft()
            wait = at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
    finally:
        feeder.cancel()


async def handle(creader, cwriter):
    if state['open'] >= args.max_connections:
        cwriter.close()
        return
    state['conns'] += 1
    state['open'] += 1
    n = state['conns']
    counter = collections.Counter()
    try:
        sreader, swriter = await asyncio.open_connection('127.0.0.1', args.target)
    except OSError as e:
        log('conn %d cannot reach target: %s' % (n, e))
        state['open'] -= 1
        cwriter.close()
        return
    log('conn %d open' % n)
    try:
        await asyncio.gather(pump(creader, swriter, counter, 'up'),
                             pump(sreader, cwriter, counter, 'down'))
    finally:
        for w in (swriter, cwriter):
            try:
                w.close()
            except Exception:
                pass
        state['open'] -= 1
        log('conn %d close up=%d down=%d chunks_up=%d chunks_down=%d'
            % (n, counter['up'], counter['down'], counter['chunks_up'],
               counter['chunks_down']))


async def main():
    global done
    done = asyncio.Event()
    server = await asyncio.start_server(handle, host='127.0.0.1', port=args.listen,
                                        reuse_address=True)
    log('listening on 127.0.0.1:%d -> 127.0.0.1:%d, %.1f ms up, %.1f ms down'
        % (args.listen, args.target, delays['up'] * 1000, delays['down'] * 1000))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, done.set)
    parent = os.getppid()
    deadline = time.time() + args.lifetime
    while time.time() < deadline and os.getppid() == parent and not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), 0.2)
        except asyncio.TimeoutError:
            pass
    server.close()
    log('exit: %d connections, %d bytes, chunks_up=%d chunks_down=%d'
        % (state['conns'], state['bytes'], state['chunks_up'], state['chunks_down']))


try:
    asyncio.run(main())
except KeyboardInterrupt:
    pass
sys.exit(0)

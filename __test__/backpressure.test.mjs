// The events waiting for the JS thread are bounded: while it is stalled, a flood stays in the
// relay's mailbox instead of growing the process's native memory
// (`docs/architecture.md#backpressure-from-the-application`).
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { test } from 'node:test'

import { PeerProcess, connected, peerConfig, startRelay, started, tempDir, until } from './helpers.mjs'

const MESSAGES = 2000
const CONTENT_BYTES = 48 * 1024
const FLOOD_BYTES = MESSAGES * CONTENT_BYTES

/** Resident memory of process `pid`, in bytes. */
function rss(pid) {
  const kb = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return Number(kb[1]) * 1024
}

test('a flood while the JS thread is stalled pauses intake instead of growing native memory', { skip: process.platform !== 'linux' && 'reads /proc' }, async (t) => {
  const dir = tempDir(t)
  // Room for the whole flood from one sender: the relay's default share per sender is 10 % of
  // the mailbox. And the rate lifted: at the default 4 MiB a second alice's outbox (500 entries)
  // would overflow while the flood is accepted faster than it leaves.
  const relay = await startRelay(t, {
    mailbox: { maxMessages: 100_000, maxBytes: 2 ** 30 },
    rateLimit: { burst: 1_000_000, perSec: 1_000_000 },
  })
  const bob = new PeerProcess(peerConfig('bob', dir, relay.url))
  t.after(() => bob.kill())
  await bob.request({ cmd: 'start' })
  await bob.waitFor(connected)
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  // Warm bob's paths (storage, the event queue) with a first message.
  const first = await alice.protocol.sendMessage('bob', 'hello')
  await bob.waitFor((e) => e.type === 'message_received' && e.messageId === first)
  const before = rss(bob.child.pid)

  // From here bob's listeners never run again.
  await bob.request({ cmd: 'block' })
  const padding = 'x'.repeat(CONTENT_BYTES)
  for (let i = 0; i < MESSAGES; i += 100) {
    const batch = []
    for (let j = i; j < Math.min(i + 100, MESSAGES); j++) batch.push(alice.protocol.sendMessage('bob', `${j}:${padding}`))
    await Promise.all(batch)
  }
  const sent = new Set()
  await until(
    () => {
      for (const e of alice.recorder.events) if (e.type === 'message_sent' || e.type === 'message_delivered') sent.add(e.messageId)
      return sent.size >= MESSAGES
    },
    { timeoutMs: 120_000, what: 'the relay to take the whole flood' },
  )

  // Bob takes frames until his intake pauses; an unbounded queue would take them all. Either
  // way the relay's count of stored frames stops moving.
  let last = -1
  let still = 0
  await until(
    () => {
      const stored = relay.stats().storedFrames
      still = stored === last ? still + 1 : 0
      last = stored
      return stored === 0 || still >= 200
    },
    { timeoutMs: 120_000, what: "bob's intake to settle" },
  )
  const grown = rss(bob.child.pid) - before
  assert.ok(last > MESSAGES / 2, `most of the flood waits at the relay (${last} of ${MESSAGES} frames stored)`)
  assert.ok(
    grown < FLOOD_BYTES / 2,
    `bob grew by ${(grown / 2 ** 20).toFixed(1)} MiB for a ${(FLOOD_BYTES / 2 ** 20).toFixed(1)} MiB flood`,
  )
})

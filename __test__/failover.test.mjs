// `transports.internet.url` as a list of relay nodes (docs/protocol.md#reconnection): when the
// node a client is on goes away, the client dials the next one and delivery goes on there.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { peerConfig, startRelay, started, tempDir, until, waitFor } from './helpers.mjs'

test('a client whose relay node stops fails over to the next node in its list and delivers there', async (t) => {
  const dir = tempDir(t)
  const nodes = [await startRelay(t), await startRelay(t)]
  const urls = nodes.map((n) => n.url)
  const alice = await started(t, peerConfig('alice', dir, urls))
  // The node alice picked (at random) is the one that goes away.
  await until(() => nodes.some((n) => n.stats().connections === 1), { what: 'alice on one node' })
  const lost = nodes.find((n) => n.stats().connections === 1)
  const survivor = nodes.find((n) => n !== lost)
  const bob = await started(t, peerConfig('bob', dir, survivor.url))

  await lost.stop()
  const diagnostic = await waitFor(alice.recorder, (e) => e.type === 'diagnostic' && e.message.includes('lost'), { what: 'connection lost' })
  assert.match(diagnostic.message, new RegExp(`relay connection to ${lost.url} lost: .*; next attempt at ${survivor.url}$`))
  await until(() => survivor.stats().connections === 2, { what: 'alice and bob on the survivor' })

  const id = await alice.protocol.sendMessage('bob', 'after failover')
  const received = await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)
  assert.equal(received.content, 'after failover')
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
})

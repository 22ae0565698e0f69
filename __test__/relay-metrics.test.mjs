// The embedded relay serves the same health and Prometheus endpoints as `courier-relay
// --metrics-listen` (docs/operating-the-relay.md): scraped around a delivery, the counters move.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { Relay } from '../js/index.js'
import { SECRET, peerConfig, startRelay, started, tempDir, waitFor } from './helpers.mjs'

/** The value of the sample `name{labels}` (labels as written, or none) in Prometheus text. */
function sample(text, name, labels = '') {
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels} `))
  return line === undefined ? undefined : Number(line.split(' ').at(-1))
}

test('Relay.start with metricsListen serves /healthz, /readyz and /metrics that move with a delivery', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t, { metricsListen: '127.0.0.1:0' })
  assert.match(relay.metricsAddress, /^127\.0\.0\.1:\d+$/)
  const base = `http://${relay.metricsAddress}`
  assert.equal((await fetch(`${base}/healthz`)).status, 200)
  assert.equal((await fetch(`${base}/readyz`)).status, 200)

  const before = await (await fetch(`${base}/metrics`)).text()
  const bob = await started(t, peerConfig('bob', dir, relay.url))
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'counted')
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  const after = await (await fetch(`${base}/metrics`)).text()

  assert.equal(sample(after, 'courier_relay_authenticated_connections'), 2)
  assert.equal(sample(after, 'courier_relay_accounts'), 2)
  for (const counter of ['courier_relay_connections_accepted_total', 'courier_relay_journal_appended_frames_total']) {
    assert.ok(sample(after, counter) > (sample(before, counter) ?? 0), `${counter} moved`)
  }
})

test('without metricsListen no metrics listener is opened, and a bad address is a config error', async (t) => {
  const relay = await startRelay(t)
  assert.equal(relay.metricsAddress, null)
  await assert.rejects(Relay.start({ storage: { memory: true }, jwtSecret: SECRET, metricsListen: 'nowhere' }), {
    code: 'ERR_CONFIG',
    message: /metricsListen must be an address/,
  })
  await assert.rejects(Relay.start({ storage: { memory: true }, jwtSecret: SECRET, maxConnections: 0 }), { code: 'ERR_CONFIG' })
})

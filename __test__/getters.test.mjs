// What an app reads synchronously agrees with the events it has been given: a getter called
// inside a listener never answers from a state older than the event, and `start()` resolves
// with the app carriers registered before it already up.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { Protocol } from '../js/index.js'
import { PLAINTEXT, record, startRelay, token, waitFor } from './helpers.mjs'

const ROUNDS = 100

test(`inside listeners, stats() and the watchlist are never behind the event (${ROUNDS} rounds)`, async (t) => {
  // One account logs in once a round.
  const relay = await startRelay(t, { authLimits: { attemptsPerAccount: { burst: ROUNDS } } })
  const wrong = []
  for (let round = 0; round < ROUNDS; round++) {
    // A fresh device each round, so every count starts at zero and a stale read shows.
    const alice = new Protocol({
      appId: 'test',
      storage: { memory: true },
      transports: { internet: { url: relay.url, authToken: token('alice') } },
      encryption: PLAINTEXT,
    })
    alice.registerTransport('pipe', { send: async () => {} })
    const recipient = `nobody-${round}`
    const checks = []
    alice.onEvent((e) => {
      if (e.type === 'internet_status_changed' && e.authenticated) {
        // The relay and the app carrier.
        checks.push(['carriersUp in internet_status_changed', alice.stats().carriersUp >= 2])
      }
      if (e.type === 'message_undeliverable' && e.recipient === recipient) {
        checks.push(['the recipient in the watchlist', alice.internetPresenceWatchlist().includes(recipient)])
        checks.push(['parked in message_undeliverable', alice.stats().parked >= 1])
      }
    })
    const recorder = record(alice)
    await alice.start()
    checks.push(['carriersUp right after start()', alice.stats().carriersUp >= 1])
    await waitFor(recorder, (e) => e.type === 'internet_status_changed' && e.authenticated, { what: `round ${round}: the relay` })
    const id = await alice.sendMessage(recipient, 'to nobody')
    const undeliverable = await waitFor(recorder, (e) => e.type === 'message_undeliverable' && e.messageId === id, {
      what: `round ${round}: message_undeliverable`,
    })
    await alice.stop()
    assert.equal(undeliverable.reasonCode, 'unknown_recipient')
    assert.equal(new Set(checks.map(([what]) => what)).size, 4, `round ${round}: every check ran: ${JSON.stringify(checks)}`)
    for (const [what, ok] of checks) if (!ok) wrong.push(`round ${round}: ${what}`)
  }
  assert.deepEqual(wrong, [])
})

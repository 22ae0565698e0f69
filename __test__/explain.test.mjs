// A message's life, after the fact: `explainMessage` and `messageTimeline` for each way a message
// ends (docs/delivery.md#a-messages-life), with a real relay on loopback and real SQLite files.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { Protocol, Relay } from '../js/index.js'
import { PLAINTEXT, SECRET, connected, peerConfig, record, startRelay, started, tempDir, until, waitFor } from './helpers.mjs'

const kinds = (timeline) => timeline.entries.map((e) => e.kind)
const CLOCK = /\d\d:\d\d/

/** A relay knows bob's account, and bob is offline. */
async function bobWasHere(t, dir, relay) {
  const bob = new Protocol(peerConfig('bob', dir, relay.url))
  const events = record(bob)
  await bob.start()
  await waitFor(events, connected)
  await bob.stop()
  await until(() => relay.stats().connections === 0, { what: 'the relay to see bob leave' })
}

/** A device with no relay: its sends wait for a carrier. */
const offline = (dir, name, extra = {}) => ({ appId: 'test', storage: { path: `${dir}/${name}.db` }, encryption: PLAINTEXT, ...extra })

test('a message delivered live is explained with its carrier, its acknowledgement and its timeline', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  await started(t, peerConfig('bob', dir, relay.url))
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'hello')
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)

  const { sentence, facts } = await alice.protocol.explainMessage(id)
  assert.match(sentence, /^delivered at \d\d:\d\d: acknowledged by bob over the relay; 1 attempt over the relay; .+ after it was accepted$/)
  assert.equal(facts.state, 'delivered')
  assert.equal(facts.direction, 'outbound')
  assert.equal(facts.peer, 'bob')
  assert.equal(facts.attempts, 1)
  assert.deepEqual(facts.carriers, ['internet'])
  assert.equal(facts.carrier, 'internet')
  assert.equal(facts.custody, false)

  const timeline = await alice.protocol.messageTimeline(id)
  assert.equal(timeline.outcome, 'delivered')
  assert.deepEqual(kinds(timeline), ['accepted', 'attempt', 'answer', 'delivered'])
  assert.equal(timeline.entries[2].disposition, 'live')
  assert.deepEqual(timeline.entries[3], { ...timeline.entries[3], kind: 'delivered', carrier: 'internet', from: 'bob' })
  assert.deepEqual(timeline.entries.map((e) => e.seq), [0, 1, 2, 3])

  const otlp = await alice.protocol.messageTimeline(id, { format: 'otlp' })
  const [span] = otlp.resourceSpans[0].scopeSpans[0].spans
  assert.match(span.traceId, /^[0-9a-f]{32}$/)
  assert.match(span.spanId, /^[0-9a-f]{16}$/)
  assert.equal(span.kind, 4)
  assert.deepEqual(span.status, { code: 1 })
  assert.deepEqual(span.events.map((e) => e.name), kinds(timeline))
  assert.equal(span.startTimeUnixNano, `${BigInt(timeline.entries[0].at) * 1_000_000n}`)
  assert.ok(span.attributes.some((a) => a.key === 'courier.message.peer' && a.value.stringValue === 'bob'))
  const delivered = span.events.at(-1).attributes
  assert.ok(delivered.some((a) => a.key === 'courier.from' && a.value.stringValue === 'bob'))
  assert.deepEqual(await alice.protocol.messageTimeline(id, { format: 'otlp' }), otlp, 'the same span each time')

  await assert.rejects(alice.protocol.explainMessage('never-sent'), (e) => e.code === 'ERR_MESSAGE_NOT_FOUND')
  await assert.rejects(alice.protocol.messageTimeline('never-sent'), (e) => e.code === 'ERR_MESSAGE_NOT_FOUND')
  await assert.rejects(alice.protocol.messageTimeline(id, { format: 'xml' }), (e) => e.code === 'ERR_INVALID_ARGUMENT')
})

test('a message delivered after the relay held it is explained as custody, then delivery', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  await bobWasHere(t, dir, relay)
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'while you were away')
  await waitFor(alice.recorder, (e) => e.type === 'message_stored' && e.messageId === id)

  const held = await alice.protocol.explainMessage(id)
  assert.equal(held.facts.state, 'custody')
  assert.match(held.sentence, /^held by the relay since \d\d:\d\d \(custody, not delivery\): bob has not acknowledged it yet; 1 attempt over the relay; next probe \d\d:\d\d; will fail at the outbox lifetime on [A-Z][a-z]{2} \d+$/)
  assert.ok(held.facts.nextAt > Date.now() - 1000)
  assert.ok(held.facts.expiresAt > Date.now())

  await started(t, peerConfig('bob', dir, relay.url))
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  const { sentence, facts } = await alice.protocol.explainMessage(id)
  assert.equal(facts.state, 'delivered')
  assert.equal(facts.custody, true)
  // Custody is a park: bob's return is also an edge that may send it again before the relay's copy is acknowledged.
  assert.match(sentence, /^delivered at \d\d:\d\d: acknowledged by bob over the relay, after the relay held it from \d\d:\d\d( and re-driven when the relay saw bob come online)?; /)
  const timeline = await alice.protocol.messageTimeline(id)
  assert.deepEqual(kinds(timeline).slice(0, 4), ['accepted', 'attempt', 'answer', 'custody'])
  assert.equal(timeline.entries[2].disposition, 'stored')
  assert.equal(kinds(timeline).at(-1), 'delivered')
})

test('a message parked on the relay\'s verdict and delivered when presence saw bob come back is explained with both', async (t) => {
  const dir = tempDir(t)
  const relay = await Relay.start({ listen: '127.0.0.1:0', storage: { memory: true }, jwtSecret: SECRET, mailbox: false })
  t.after(() => relay.stop())
  await bobWasHere(t, dir, relay)
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'are you back?')
  await waitFor(alice.recorder, (e) => e.type === 'message_undeliverable' && e.messageId === id)

  const parked = await alice.protocol.explainMessage(id)
  assert.equal(parked.facts.state, 'parked')
  assert.equal(parked.facts.parkCause, 'offline_no_mailbox')
  assert.match(parked.sentence, /^parked since \d\d:\d\d: the relay says bob has no mailbox; 1 attempt over the relay; next probe \d\d:\d\d; will fail at the outbox lifetime on [A-Z][a-z]{2} \d+$/)

  await started(t, peerConfig('bob', dir, relay.url))
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  const { sentence, facts } = await alice.protocol.explainMessage(id)
  assert.equal(facts.state, 'delivered')
  assert.equal(facts.redrives, 1)
  assert.equal(facts.redrivenBy, 'the relay saw bob come online')
  assert.match(sentence, /after it was parked at \d\d:\d\d and re-driven when the relay saw bob come online; 2 attempts over the relay/)
  const timeline = await alice.protocol.messageTimeline(id)
  assert.deepEqual(kinds(timeline), ['accepted', 'attempt', 'answer', 'parked', 'redriven', 'attempt', 'answer', 'delivered'])
  assert.equal(timeline.entries[3].cause, 'offline_no_mailbox')
})

test('a message nobody acknowledges is explained as failed by its retries', async (t) => {
  const dir = tempDir(t)
  const alice = await started(
    t,
    offline(dir, 'alice', { reliability: { ack: { defaultTimeoutMs: 100 }, retry: { maxRetries: 2, initialDelayMs: 20, maxDelayMs: 40 } } }),
    { connect: false },
  )
  // A radio link that takes every frame and never brings anything back.
  alice.protocol.registerTransport('void', { send: async () => {} })
  alice.protocol.neighborDiscovered('bob', 'void')
  const id = await alice.protocol.sendMessage('bob', 'hello?')
  await waitFor(alice.recorder, (e) => e.type === 'message_failed' && e.messageId === id)

  const { sentence, facts } = await alice.protocol.explainMessage(id)
  assert.equal(facts.state, 'failed')
  assert.equal(facts.reason, 'Max retries exceeded')
  assert.equal(facts.attempts, 3)
  assert.equal(facts.retries, 2)
  assert.deepEqual(facts.carriers, ['void'])
  assert.match(sentence, /^failed at \d\d:\d\d: bob never acknowledged it and the ACK retries ran out \(max retries exceeded\); 3 attempts over void$/)
  const timeline = await alice.protocol.messageTimeline(id)
  assert.deepEqual(timeline.entries.filter((e) => e.kind === 'retrying').map((e) => e.ladderStep), [0, 1])
  assert.equal(timeline.outcome, 'failed')
  const otlp = await alice.protocol.messageTimeline(id, { format: 'otlp' })
  assert.deepEqual(otlp.resourceSpans[0].scopeSpans[0].spans[0].status, { code: 2, message: 'failed' })
})

test('a message no carrier took in its lifetime is explained as failed by the lifetime', async (t) => {
  const dir = tempDir(t)
  const alice = await started(t, offline(dir, 'alice', { reliability: { retry: { outboxMaxLifetimeMs: 200 } } }), { connect: false })
  const id = await alice.protocol.sendMessage('bob', 'into the void')
  await waitFor(alice.recorder, (e) => e.type === 'message_failed' && e.messageId === id)

  const { sentence, facts } = await alice.protocol.explainMessage(id)
  assert.equal(facts.state, 'failed')
  assert.equal(facts.reason, 'Outbox lifetime exceeded')
  assert.equal(facts.attempts, 0)
  assert.match(sentence, /^failed at \d\d:\d\d: the outbox lifetime ran out before bob acknowledged it \(outbox lifetime exceeded\); not written by any carrier yet$/)
  assert.deepEqual(kinds(await alice.protocol.messageTimeline(id)), ['accepted', 'deferred', 'failed'])
})

test('a message pushed out of a full outbox is explained as evicted by capacity', async (t) => {
  const dir = tempDir(t)
  const alice = await started(t, offline(dir, 'alice'), { connect: false })
  const first = await alice.protocol.sendMessage('bob', 'the oldest')
  // The outbox holds 500 regular messages: the 501st pushes the oldest out.
  const rest = await Promise.all(Array.from({ length: 500 }, (_, i) => alice.protocol.sendMessage('bob', `m${i}`)))
  await waitFor(alice.recorder, (e) => e.type === 'message_failed' && e.messageId === first)

  const { sentence, facts } = await alice.protocol.explainMessage(first)
  assert.equal(facts.state, 'failed')
  assert.equal(facts.reason, 'Outbox capacity exceeded')
  assert.match(sentence, /^failed at \d\d:\d\d: evicted to make room in a full outbox \(outbox capacity exceeded\); not written by any carrier yet$/)
  // The ones still in the outbox wait for a carrier.
  const waiting = await alice.protocol.explainMessage(rest.at(-1))
  assert.equal(waiting.facts.state, 'queued')
  assert.match(waiting.sentence, /^waiting for a carrier since \d\d:\d\d: .+; not written by any carrier yet; will fail at the outbox lifetime on [A-Z][a-z]{2} \d+$/)
})

test('a message the durability hook refused once is explained as received after the refused batch', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  let refuse = true
  const bob = await started(t, {
    ...peerConfig('bob', dir, relay.url),
    inboundDurabilityHook: async () => {
      if (refuse) {
        refuse = false
        throw new Error('disk unavailable')
      }
    },
  })
  const alice = await started(t, peerConfig('alice', dir, relay.url))
  const id = await alice.protocol.sendMessage('bob', 'try again')
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)

  const { sentence, facts } = await bob.protocol.explainMessage(id)
  assert.equal(facts.direction, 'inbound')
  assert.equal(facts.state, 'received')
  assert.equal(facts.peer, alice.protocol.localAddress())
  assert.equal(facts.hookRefusals, 1)
  assert.match(facts.hookRefusal, /disk unavailable/)
  assert.match(sentence, new RegExp(`^received from ${alice.protocol.localAddress()} at ${CLOCK.source} over the relay, committed by the durability hook in batch \\d+ after the durability hook refused 1 batch \\(.*disk unavailable.*\\)$`))
  const timeline = await bob.protocol.messageTimeline(id)
  assert.deepEqual(kinds(timeline), ['buffered', 'hook_offered', 'hook_refused', 'hook_offered', 'hook_committed', 'received'])
  assert.equal(timeline.entries[1].origin, 'live')
  assert.equal(timeline.entries[3].origin, 'redelivery')
  assert.equal(timeline.outcome, 'received')
  const otlp = await bob.protocol.messageTimeline(id, { format: 'otlp' })
  assert.equal(otlp.resourceSpans[0].scopeSpans[0].spans[0].kind, 5)
})

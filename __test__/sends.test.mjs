// sendMessage bursts: the calls of one turn cross to the native side together, in call order,
// and each still settles on its own.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { test } from 'node:test'

import { Protocol, ProtocolError } from '../js/index.js'
import { PLAINTEXT, peerConfig, startRelay, tempDir } from './helpers.mjs'

const require = createRequire(import.meta.url)
const native = require('../native.js')

test('a burst with a bad send in it refuses that one alone, in place, and accepts the rest', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const p = new Protocol(peerConfig('alice', dir, relay.url))
  await p.start()
  t.after(() => p.stop())
  const sends = []
  for (let i = 0; i < 10; i++) {
    // Refused natively, halfway through the burst: a reserved metadata key, a bad recipient.
    if (i === 3) sends.push(p.sendMessage('bob', 'x', { metadata: { ack_for: 'm' } }))
    else if (i === 6) sends.push(p.sendMessage('a/b', 'x'))
    else sends.push(p.sendMessage('bob', `m${i}`, { id: `burst-${i}` }))
  }
  const settled = await Promise.allSettled(sends)
  settled.forEach((outcome, i) => {
    if (i === 3 || i === 6) {
      assert.equal(outcome.status, 'rejected', `send ${i}`)
      assert.ok(outcome.reason instanceof ProtocolError)
      assert.equal(outcome.reason.code, 'ERR_INVALID_ARGUMENT')
      assert.match(outcome.reason.message, i === 3 ? /reserved/ : /recipient/)
    } else {
      assert.deepEqual(outcome, { status: 'fulfilled', value: `burst-${i}` })
    }
  })
  assert.equal(p.stats().outboxRegular, 8)
})

test('a burst larger than one crossing keeps its call order and settles every send', async (t) => {
  const dir = tempDir(t)
  // No carrier: what the outbox keeps stays queued, whatever the timing.
  const p = new Protocol({ appId: 'test', storage: { path: `${dir}/p.db` }, encryption: PLAINTEXT })
  await p.start()
  t.after(() => p.stop())
  const count = 2500
  const ids = await Promise.all(Array.from({ length: count }, (_, i) => p.sendMessage('bob', `m${i}`, { id: `order-${i}` })))
  assert.deepEqual(ids, Array.from({ length: count }, (_, i) => `order-${i}`))
  // The outbox keeps the latest 500 (docs/delivery.md#outbox-capacity): accepted in call order,
  // the first ones were evicted and the last ones are kept.
  assert.equal(p.stats().outboxRegular, 500)
  assert.equal(await p.getMessageStatus('order-0'), 'failed')
  assert.equal(await p.getMessageStatus(`order-${count - 500 - 1}`), 'failed')
  assert.equal(await p.getMessageStatus(`order-${count - 500}`), 'queued')
  assert.equal(await p.getMessageStatus(`order-${count - 1}`), 'queued')
  const minted = await Promise.all(Array.from({ length: count }, () => p.sendMessage('bob', 'minted')))
  assert.equal(new Set(minted).size, count)
  assert.equal(await p.getMessageStatus(minted[count - 1]), 'queued')
})

test('a call made right after a send, in the same turn, sees the send', async (t) => {
  const dir = tempDir(t)
  // No carrier: the message stays queued, whatever the timing.
  const p = new Protocol({ appId: 'test', storage: { path: `${dir}/p.db` }, encryption: PLAINTEXT })
  await p.start()
  const sent = p.sendMessage('bob', 'just before', { id: 'same-turn' })
  assert.equal(await p.getMessageStatus('same-turn'), 'queued')
  const last = p.sendMessage('bob', 'just before stopping', { id: 'before-stop' })
  const stopped = p.stop()
  assert.equal(await sent, 'same-turn')
  assert.equal(await last, 'before-stop')
  await stopped
  await p.start()
  t.after(() => p.stop())
  assert.equal(await p.getMessageStatus('same-turn'), 'queued')
  assert.equal(await p.getMessageStatus('before-stop'), 'queued')
})

test('the native batch answers each input in place: an id, or an Error with its code', async (t) => {
  const dir = tempDir(t)
  const p = new native.NativeProtocol(JSON.stringify({ appId: 'test', storage: { path: `${dir}/p.db` }, encryption: PLAINTEXT }))
  assert.throws(() => p.sendMessages([{ recipient: 'bob', content: 'x' }]), (e) => e.code === 'ERR_NOT_STARTED')
  await p.start(() => {}, () => {}, () => {}, () => {})
  t.after(() => p.stop())
  const answers = await p.sendMessages([
    { recipient: 'bob', content: 'one', id: 'n1' },
    { recipient: 'bob', content: '__CTRL_x' },
    { recipient: 'bob', content: 'three', extrasJson: '[1]' },
    { recipient: 'bob', content: 'four' },
  ])
  assert.equal(answers.length, 4)
  assert.equal(answers[0], 'n1')
  for (const i of [1, 2]) {
    assert.ok(answers[i] instanceof Error, `answer ${i}: ${answers[i]}`)
    assert.equal(answers[i].code, 'ERR_INVALID_ARGUMENT')
  }
  assert.match(answers[1].message, /reserved/)
  assert.match(answers[2].message, /extras/)
  assert.equal(typeof answers[3], 'string')
  assert.equal(p.stats().outboxRegular, 2)
})

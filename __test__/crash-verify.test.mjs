// The crash run's verifier on small hand-made runs: it passes a healthy one and flags each
// kind of broken one, so a crash run that reports no violations means something
// (scripts/crash/verify.mjs).
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'

import Database from 'better-sqlite3'

import { verify } from '../scripts/crash/verify.mjs'
import { wireId } from '../scripts/crash/wire-id.mjs'
import { tempDir } from './helpers.mjs'

const T0 = 1_000_000
const PIDS = { alice: 11, bob: 22 }

/**
 * Writes one app's files: its log (a start and a relay connection at T0, then `log`), the
 * engine's settled and outbox rows, and the app's inbox.
 */
function files(dir, name, { log = [], settled = [], outbox = [], inbox = [] }) {
  const paths = { storage: join(dir, `${name}.db`), inbox: join(dir, `${name}-inbox.db`), log: join(dir, `${name}.log`) }
  const lifeline = [
    { t: 'start', pid: PIDS[name], at: T0 },
    { t: 'identity', address: `addr-${name}`, at: T0 },
    { t: 'connection', connected: true, at: T0 + 1 },
  ]
  writeFileSync(paths.log, [...lifeline, ...log].map((r) => `${JSON.stringify(r)}\n`).join(''))
  const engine = new Database(paths.storage)
  engine.exec(`CREATE TABLE settled (id TEXT, recipient TEXT, outcome TEXT, reason TEXT, at INTEGER);
    CREATE TABLE outbox (id TEXT, recipient TEXT, state TEXT);
    CREATE TABLE pending_inbound (id TEXT);`)
  for (const r of settled) engine.prepare('INSERT INTO settled VALUES (?, ?, ?, ?, ?)').run(r.id, r.recipient, r.outcome, r.reason ?? null, r.at)
  for (const r of outbox) engine.prepare('INSERT INTO outbox VALUES (?, ?, ?)').run(r.id, r.recipient, r.state)
  engine.close()
  const app = new Database(paths.inbox)
  app.exec(`CREATE TABLE inbox (chat TEXT, sender TEXT, message_id TEXT, content TEXT, received_at INTEGER);
    CREATE TABLE offers (chat TEXT, sender TEXT, message_id TEXT, n INTEGER);`)
  for (const r of inbox) {
    app.prepare('INSERT INTO inbox VALUES (?, ?, ?, ?, ?)').run(r.sender, r.sender, r.id, r.content, r.at)
    app.prepare('INSERT INTO offers VALUES (?, ?, ?, 1)').run(r.sender, r.sender, r.id)
  }
  app.close()
  return { name, ...paths }
}

/**
 * Alice sends two messages to bob: `alice-2` (an id of her own, stored by bob under its wire
 * id) at T0 + 100 and a minted one at T0 + 200, and both are delivered; `change` edits the run.
 */
function run(t, change = (r) => r) {
  const minted = randomUUID()
  const base = {
    minted,
    kills: [],
    alice: {
      log: [
        { t: 'intent', seq: 2, to: 'bob', id: 'alice-2', at: T0 + 100 },
        { t: 'sent', seq: 2, id: 'alice-2', to: 'bob', at: T0 + 101 },
        { t: 'delivered', id: 'alice-2', replayed: false, at: T0 + 150 },
        { t: 'intent', seq: 3, to: 'bob', at: T0 + 200 },
        { t: 'sent', seq: 3, id: minted, to: 'bob', at: T0 + 201 },
        { t: 'delivered', id: minted, replayed: false, at: T0 + 250 },
      ],
      settled: [
        { id: 'alice-2', recipient: 'bob', outcome: 'delivered', at: T0 + 150 },
        { id: minted, recipient: 'bob', outcome: 'delivered', at: T0 + 250 },
      ],
    },
    bob: {
      inbox: [
        { sender: 'addr-alice', id: wireId('alice-2'), content: 'alice:2', at: T0 + 120 },
        { sender: 'addr-alice', id: minted, content: 'alice:3', at: T0 + 220 },
      ],
    },
  }
  const r = change(base)
  const dir = tempDir(t)
  const peers = ['alice', 'bob'].map((name) => ({ ...files(dir, name, r[name]), kills: r.kills.filter((k) => k.victim === name) }))
  return verify({ peers, kills: r.kills, startedAt: T0 }).violations
}

/** Alice's `alice-2` failed by lifetime at T0 + 5000 instead, though it reached bob. */
function failAlice2(r) {
  r.alice.log[2] = { t: 'failed', id: 'alice-2', reason: 'Outbox lifetime exceeded', replayed: false, at: T0 + 5000 }
  r.alice.settled[0] = { id: 'alice-2', recipient: 'bob', outcome: 'failed', reason: 'Outbox lifetime exceeded', at: T0 + 5000 }
  return r
}

test('wireId maps an app id as courier_proto::wire_id does', () => {
  // Pinned in courier-proto's wire_id tests too.
  assert.equal(wireId('order-42'), '22c5b759-271b-5cf4-a8db-c1e22b197272')
  assert.equal(wireId('é'), '0b8c5265-a15d-52da-8f6e-52c1ae58c491')
  const minted = randomUUID()
  assert.equal(wireId(minted), minted)
  assert.notEqual(wireId(minted.toUpperCase()), minted.toUpperCase())
})

test('the verifier passes a healthy run', (t) => {
  assert.deepEqual(run(t), [])
})

test('a message to the other app that fails with no kill and no lost connection in its life is a violation', (t) => {
  const violations = run(t, failAlice2)
  assert.equal(violations.length, 1, violations.join('\n'))
  assert.match(violations[0], /alice-2 to bob failed \(Outbox lifetime exceeded\) at \+5\.000 s, though no process was killed and both apps stayed connected since its sendMessage at \+0\.100 s \(it is in bob's inbox\)/)
})

test('a kill or a lost connection in its life excuses the failure', (t) => {
  const killed = (r) => ({ ...failAlice2(r), kills: [{ at: T0 + 3000, pid: 99, victim: 'relay' }] })
  assert.deepEqual(run(t, killed), [])
  const disconnected = (r) => {
    failAlice2(r).bob.log = [{ t: 'connection', connected: false, at: T0 + 3000 }, { t: 'connection', connected: true, at: T0 + 3500 }]
    return r
  }
  assert.deepEqual(run(t, disconnected), [])
})

test('an account that never connects may only fail by lifetime, never be delivered', (t) => {
  const toGhost = (outcome, reason) => (r) => {
    r.alice.log.push({ t: 'intent', seq: 4, to: 'ghost', id: 'alice-4', at: T0 + 300 }, { t: 'sent', seq: 4, id: 'alice-4', to: 'ghost', at: T0 + 301 })
    r.alice.log.push({ t: outcome, id: 'alice-4', reason, replayed: false, at: T0 + 9000 })
    r.alice.settled.push({ id: 'alice-4', recipient: 'ghost', outcome, reason, at: T0 + 9000 })
    return r
  }
  assert.deepEqual(run(t, toGhost('failed', 'Outbox lifetime exceeded')), [])
  assert.match(run(t, toGhost('failed', 'Max retries exceeded')).join('\n'), /alice-4 to ghost failed \(Max retries exceeded\).*never connected/)
  assert.match(run(t, toGhost('delivered')).join('\n'), /alice-4 settled delivered to ghost, an account that never connected/)
})

test('nothing delivered to the other app is a violation', (t) => {
  const none = (r) => {
    failAlice2(r)
    r.alice.log[5] = { t: 'failed', id: r.minted, reason: 'Max retries exceeded', replayed: false, at: T0 + 6000 }
    r.alice.settled[1] = { id: r.minted, recipient: 'bob', outcome: 'failed', reason: 'Max retries exceeded', at: T0 + 6000 }
    r.kills = [{ at: T0 + 1000, pid: 99, victim: 'relay' }]
    return r
  }
  assert.deepEqual(run(t, none), ['alice: none of its 2 messages to bob was delivered'])
})

test('a capacity failure needs a full outbox', (t) => {
  const evicted = (r) => {
    r.alice.log[2] = { t: 'failed', id: 'alice-2', reason: 'Outbox capacity exceeded', replayed: false, at: T0 + 150 }
    r.alice.settled[0] = { id: 'alice-2', recipient: 'bob', outcome: 'failed', reason: 'Outbox capacity exceeded', at: T0 + 150 }
    return r
  }
  assert.match(run(t, evicted).join('\n'), /alice-2 to bob failed \(Outbox capacity exceeded\) at \+0\.150 s, while its outbox held 1 of at most 500/)
})

test('a sendMessage cut short must be followed by a kill of the process that called it', (t) => {
  const cut = (kills) => (r) => {
    r.alice.log.push({ t: 'intent', seq: 5, to: 'bob', id: 'alice-5', at: T0 + 400 })
    r.kills = kills
    return r
  }
  assert.match(run(t, cut([])).join('\n'), /alice: sendMessage #5 at \+0\.400 s never resolved, yet no kill of its process \(pid 11\) followed/)
  assert.match(run(t, cut([{ at: T0 + 450, pid: 22, victim: 'bob' }])).join('\n'), /sendMessage #5/, 'a kill of another process does not count')
  assert.deepEqual(run(t, cut([{ at: T0 + 450, pid: 11, victim: 'alice' }])), [])
})

test('an inbox row must hold what was sent under its id', (t) => {
  const swapped = (r) => {
    r.bob.inbox[0].content = 'alice:3'
    r.bob.inbox[1].content = 'alice:2'
    return r
  }
  const violations = run(t, swapped)
  assert.equal(violations.length, 2, violations.join('\n'))
  assert.match(violations[0], new RegExp(`bob: inbox row ${wireId('alice-2')} from alice holds "alice:3", but alice-2 was sent as "alice:2"`))
  // An app id stored as is, not under its wire id, is a message alice never sent.
  const unmapped = (r) => {
    r.bob.inbox[0].id = 'alice-2'
    return r
  }
  assert.match(run(t, unmapped).join('\n'), /bob: inbox row alice-2 from alice, which alice never accepted/)
})

/**
 * Alice's first process settles the minted message at T0 + 250 and dies before its listeners
 * ran; `replay` lists what the log holds after the settlement. The kill is noted at T0 + 240:
 * the time is taken just before the signal, and a loaded machine may let the victim commit after.
 */
function replayed(replay, kills = [{ at: T0 + 240, pid: PIDS.alice, victim: 'alice' }]) {
  return (r) => {
    r.alice.log.splice(5, 1, ...replay)
    r.kills = kills
    return r
  }
}
const restart = { t: 'start', pid: 33, at: T0 + 400 }
const replay = (at) => ({ t: 'delivered', id: null, replayed: true, at })
const withMinted = (r, records) => records.map((e) => (e.t === 'delivered' ? { ...e, id: r.minted } : e))

test('a terminal event replayed by the next process after a kill passes, whenever the kill was noted', (t) => {
  const violations = run(t, (r) => replayed(withMinted(r, [restart, replay(T0 + 500)]))(r))
  assert.deepEqual(violations.filter((v) => v.includes('replayed')), [])
})

test('a terminal event replayed by the process that settled it is flagged', (t) => {
  const violations = run(t, (r) => replayed(withMinted(r, [replay(T0 + 300)]))(r))
  assert.equal(violations.filter((v) => v.includes('a replayed terminal event at')).length, 1, violations.join('\n'))
})

test('a terminal event replayed again by the process that replayed it first is flagged', (t) => {
  const violations = run(t, (r) => replayed(withMinted(r, [restart, replay(T0 + 500), replay(T0 + 600)]))(r))
  assert.equal(violations.filter((v) => v.includes('before the settlement or the event it repeats')).length, 1, violations.join('\n'))
})

test('a terminal event replayed after a process that was not killed is flagged', (t) => {
  const violations = run(t, (r) => replayed(withMinted(r, [restart, replay(T0 + 500)]), [])(r))
  assert.equal(violations.filter((v) => v.includes('with no kill of the sender before it')).length, 1, violations.join('\n'))
})

// The verdict of a crash run, read from what survived the kills: each engine's storage (the
// outbox, the settled outcomes, the inbound buffer), each app's own inbox database, each app's
// append-only log and the kill log.
import { existsSync, readFileSync } from 'node:fs'

import Database from 'better-sqlite3'

import { wireId } from './wire-id.mjs'

export const DOCUMENTED_FAILURE_REASONS = new Set([
  'Max retries exceeded',
  'Outbox lifetime exceeded',
  'Outbox capacity exceeded',
  'Pending session lifetime exceeded',
  'Pending session queue capacity exceeded',
])

/** The engine's bound on regular outbox entries (`Config::outbox_max_entries`; not a JS option). */
const OUTBOX_MAX_ENTRIES = 500

/**
 * How far a kill's timestamp, taken by the supervisor just before the signal, may trail the
 * victim's last log record.
 */
const KILL_SLACK_MS = 1000

/** The records of an app log; a line torn by a kill (none expected: one write per line) is counted. */
export function readLog(path) {
  const records = []
  let torn = 0
  if (!existsSync(path)) return { records, torn }
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    if (line === '') continue
    try {
      records.push(JSON.parse(line))
    } catch {
      torn++
    }
  }
  return { records, torn }
}

function readOnly(path, read) {
  const db = new Database(path, { readonly: true, fileMustExist: true })
  try {
    return read(db)
  } finally {
    db.close()
  }
}

/** What a peer's files say. */
function loadPeer(peer) {
  const { records, torn } = readLog(peer.log)
  const engine = readOnly(peer.storage, (db) => ({
    settled: new Map(db.prepare('SELECT id, recipient, outcome, reason, at FROM settled').all().map((r) => [r.id, r])),
    outbox: new Map(db.prepare('SELECT id, recipient, state FROM outbox').all().map((r) => [r.id, r])),
    pendingInbound: db.prepare('SELECT COUNT(*) AS n FROM pending_inbound').get().n,
  }))
  const app = readOnly(peer.inbox, (db) => ({
    inbox: db.prepare('SELECT chat, sender, message_id AS id, content FROM inbox').all(),
    offers: db.prepare('SELECT message_id AS id, n FROM offers').all(),
  }))
  const addresses = new Set(records.filter((r) => r.t === 'identity').map((r) => r.address))
  // Process starts and relay connection changes, in time order: whether the app was connected.
  const lifeline = records.filter((r) => r.t === 'start' || r.t === 'connection')
  return { ...peer, records, torn, engine, app, addresses, lifeline }
}

/** Whether `peer`'s relay connection was up from `from` to `to`, without a break or a restart. */
function connectedThroughout(peer, from, to) {
  let before = null
  for (const r of peer.lifeline) {
    if (r.at <= from) before = r
    else if (r.at <= to && (r.t === 'start' || !r.connected)) return false
  }
  return before?.t === 'connection' && before.connected
}

/**
 * The terminal events the sender's app saw for one settled message. A settlement's event is
 * held in storage until its dispatch is recorded and emitted again (`replayed: true`) by the
 * next start if a kill came first: so at least one event, each matching the stored outcome, at
 * most one of them not a replay, and a replay only from a process that started after the
 * settlement and after the previous event, following a process of ours that we killed.
 *
 * Each event carries `start`, the start record of the process that logged it. The order is
 * judged on the app's own records: the time we note a kill is taken just before the signal,
 * and a loaded machine may let the victim run on for a few milliseconds after it.
 */
function checkTerminalEvents(sender, id, outcome, events, totals, violations) {
  const where = `${sender.name}: ${id} (settled ${outcome.outcome} at ${outcome.at})`
  if (events.length === 0) {
    totals.terminalLost++
    const kill = sender.kills.find((k) => k.at >= outcome.at)
    const after = kill === undefined ? 'no kill after the commit' : `killed ${kill.at - outcome.at} ms after the commit`
    violations.push(`${where}: no terminal event ever reached the app (${after})`)
    return
  }
  for (const e of events) {
    if (e.t !== outcome.outcome || (e.t === 'failed' && e.reason !== outcome.reason)) {
      violations.push(`${where}: the app saw ${e.t} ${e.reason ?? ''}`)
    }
  }
  const fresh = events.filter((e) => !e.replayed)
  if (fresh.length > 1) violations.push(`${where}: ${fresh.length} terminal events not marked replayed`)
  const killed = new Set(sender.kills.map((k) => k.pid))
  const starts = sender.lifeline.filter((r) => r.t === 'start')
  let previous = { at: outcome.at, start: null }
  for (const e of events) {
    if (e.replayed) {
      const before = starts[starts.indexOf(e.start) - 1]
      if (e.start.at < previous.at || e.start === previous.start) {
        violations.push(`${where}: a replayed terminal event at ${e.at} from a process that started at ${e.start.at}, before the settlement or the event it repeats`)
      } else if (before === undefined || !killed.has(before.pid)) {
        violations.push(`${where}: a replayed terminal event at ${e.at} with no kill of the sender before it`)
      }
    }
    previous = e
  }
  if (events.length === 1 && fresh.length === 1) totals.terminalOnce++
  else if (fresh.length === 1) totals.terminalReplayedAfterKill++
  else totals.terminalFirstSeenReplayed++
}

/**
 * What one app sent, from its log: every send it announced (`intent`, by seq) with the process
 * that announced it, what each resolved to, and every id it knows by seq.
 */
function sends(sender) {
  const intents = new Map()
  const outcomes = new Map()
  const byId = new Map()
  let pid = null
  for (const r of sender.records) {
    if (r.t === 'start') pid = r.pid
    else if (r.t === 'intent') {
      intents.set(r.seq, { ...r, pid })
      if (r.id !== undefined) byId.set(r.id, { seq: r.seq, to: r.to, at: r.at })
    } else if (r.t === 'sent' || r.t === 'send_error') outcomes.set(r.seq, r)
  }
  for (const r of outcomes.values()) {
    if (r.t === 'sent') byId.set(r.id, { seq: r.seq, to: r.to, at: intents.get(r.seq)?.at })
  }
  return { intents, outcomes, byId }
}

/**
 * Checks every guarantee the run is about and counts what happened.
 * @param {{ peers: Array<{ name, storage, inbox, log, kills: Array<{ at, pid }> }>, kills: Array<{ at, pid, victim }>, startedAt: number }} run
 *   `kills`: every kill of the run, the relay's included; `startedAt`: the run's start, which
 *   the violations count their times from.
 */
export function verify({ peers, kills, startedAt }) {
  const violations = []
  const time = (at) => `+${((at - startedAt) / 1000).toFixed(3)} s`
  const loaded = peers.map(loadPeer)
  const byAddress = new Map()
  for (const p of loaded) {
    if (p.addresses.size !== 1) violations.push(`${p.name}: ${p.addresses.size} identities across restarts (expected one)`)
    if (p.torn > 0) violations.push(`${p.name}: ${p.torn} torn log lines`)
    for (const address of p.addresses) byAddress.set(address, p)
  }
  /** Whether a kill, or a break in either app's relay connection, fell between `from` and `to`. */
  const disturbed = (from, to) =>
    kills.some((k) => k.at >= from - KILL_SLACK_MS && k.at <= to) || loaded.some((p) => !connectedThroughout(p, from, to))

  const totals = {
    accepted: 0,
    acceptedUnlogged: 0,
    sendsCut: 0,
    delivered: 0,
    failed: {},
    failedToPeer: 0,
    failedToPeerExcused: 0,
    failedButReceived: 0,
    undisturbed: 0,
    lost: 0,
    duplicates: 0,
    stuck: 0,
    terminalOnce: 0,
    terminalReplayedAfterKill: 0,
    terminalFirstSeenReplayed: 0,
    terminalLost: 0,
    redeliveriesAbsorbed: 0,
    receivedEvents: 0,
    receivedEventsCut: 0,
    // Sealed copies that did not open on an attempt (advisory: the sender's retry recovers them;
    // a message lost to a ratchet shows up as lost or failed).
    undecryptableAttempts: 0,
  }
  const perPeer = {}
  const sent = new Map(loaded.map((p) => [p, sends(p)]))
  // Every id each app sent or stored, by the wire id its recipient knows it under.
  const ids = new Map(
    loaded.map((p) => {
      const known = new Set([...sent.get(p).byId.keys(), ...p.engine.settled.keys(), ...p.engine.outbox.keys()])
      return [p, new Map([...known].map((id) => [wireId(id), id]))]
    }),
  )

  for (const sender of loaded) {
    const recipient = loaded.find((p) => p !== sender)
    // The other app, by account name or (with encryption) by address.
    const isPeer = (to) => to === recipient.name || recipient.addresses.has(to)
    const address = [...sender.addresses][0]
    const { intents, outcomes, byId } = sent.get(sender)
    const terminal = new Map()
    let start = null
    for (const r of sender.records) {
      if (r.t === 'start') start = r
      else if (r.t === 'send_error') violations.push(`${sender.name}: sendMessage #${r.seq} rejected: ${r.code} ${r.message}`)
      else if (r.t === 'delivered' || r.t === 'failed') {
        if (!terminal.has(r.id)) terminal.set(r.id, [])
        terminal.get(r.id).push({ ...r, start })
      } else if (r.t === 'superseded') violations.push(`${sender.name}: session superseded (${r.reason})`)
      else if (r.t === 'undecryptable') totals.undecryptableAttempts++
      else if (r.t === 'error') violations.push(`${sender.name}: error diagnostic: ${r.message}`)
    }
    // A sendMessage that never resolved was cut short by a kill of the process that called it.
    const cut = [...intents.values()].filter((i) => !outcomes.has(i.seq))
    for (const i of cut) {
      if (!sender.kills.some((k) => k.pid === i.pid && k.at >= i.at - KILL_SLACK_MS)) {
        violations.push(`${sender.name}: sendMessage #${i.seq} at ${time(i.at)} never resolved, yet no kill of its process (pid ${i.pid}) followed`)
      }
    }
    const { settled, outbox } = sender.engine
    const logged = [...outcomes.values()].filter((r) => r.t === 'sent')
    const accepted = new Set([...logged.map((r) => r.id), ...settled.keys(), ...outbox.keys()])
    totals.sendsCut += cut.length
    totals.acceptedUnlogged += accepted.size - logged.length
    totals.accepted += accepted.size
    perPeer[sender.name] = { accepted: accepted.size, sendsCut: cut.length }
    if (sender.engine.pendingInbound > 0) violations.push(`${sender.name}: ${sender.engine.pendingInbound} inbound messages still buffered`)

    /** Messages accepted at or before `at` and not settled before it (an unknown accept counts). */
    const heldAt = (at) =>
      [...accepted].filter((id) => (byId.get(id)?.at ?? 0) <= at && !((settled.get(id)?.at ?? Infinity) < at)).length

    const theirs = new Map(recipient.app.inbox.filter((r) => r.sender === address).map((r) => [r.id, r]))
    let toPeer = 0
    let deliveredToPeer = 0
    for (const id of accepted) {
      const outcome = settled.get(id)
      const received = theirs.has(wireId(id))
      const to = byId.get(id)?.to ?? outcome?.recipient ?? outbox.get(id)?.recipient
      if (isPeer(to)) toPeer++
      if (!outcome) {
        if (outbox.has(id)) {
          totals.stuck++
          violations.push(`${sender.name}: ${id} to ${to} still ${outbox.get(id).state} after quiescence`)
        } else {
          totals.lost++
          violations.push(`${sender.name}: ${id} to ${to} was accepted and is neither pending nor settled`)
        }
        continue
      }
      if (outbox.has(id)) violations.push(`${sender.name}: ${id} is both settled and in the outbox`)
      checkTerminalEvents(sender, id, outcome, terminal.get(id) ?? [], totals, violations)
      const acceptedAt = byId.get(id)?.at
      const undisturbed = acceptedAt !== undefined && !disturbed(acceptedAt, outcome.at)
      if (isPeer(to) && undisturbed) totals.undisturbed++
      if (outcome.outcome === 'delivered') {
        totals.delivered++
        if (isPeer(to)) deliveredToPeer++
        else violations.push(`${sender.name}: ${id} settled delivered to ${to}, an account that never connected`)
        if (!received) {
          totals.lost++
          violations.push(`${sender.name}: ${id} settled delivered but is not in ${recipient.name}'s inbox`)
        }
        continue
      }
      const reason = outcome.reason
      totals.failed[reason] = (totals.failed[reason] ?? 0) + 1
      if (!DOCUMENTED_FAILURE_REASONS.has(reason)) violations.push(`${sender.name}: ${id} failed with an undocumented reason ${reason}`)
      if (received) totals.failedButReceived++
      const where = `${sender.name}: ${id} to ${to} failed (${reason}) at ${time(outcome.at)}`
      if (reason === 'Outbox capacity exceeded') {
        const held = heldAt(outcome.at)
        if (held < OUTBOX_MAX_ENTRIES) violations.push(`${where}, while its outbox held ${held} of at most ${OUTBOX_MAX_ENTRIES}`)
        if (isPeer(to)) totals.failedToPeer++
        continue
      }
      if (!isPeer(to)) {
        // Nothing can deliver to an account that never connects: only its lifetime ends it (with
        // encryption, the lifetime of its wait for a session).
        if (reason !== 'Outbox lifetime exceeded' && reason !== 'Pending session lifetime exceeded') {
          violations.push(`${where}, an account that never connected`)
        }
        continue
      }
      totals.failedToPeer++
      // A message to the other app, up and connected all along, has no excuse not to arrive
      // unless a kill or a lost connection fell within its life. A minted id whose sendMessage a
      // kill cut short has no acceptance time in the log: the kill that cut it is its excuse.
      if (acceptedAt === undefined || !undisturbed) {
        totals.failedToPeerExcused++
        continue
      }
      violations.push(
        `${where}, though no process was killed and both apps stayed connected since its sendMessage at ${time(acceptedAt)}${received ? ` (it is in ${recipient.name}'s inbox)` : ''}`,
      )
    }
    if (toPeer > 0 && deliveredToPeer === 0) violations.push(`${sender.name}: none of its ${toPeer} messages to ${recipient.name} was delivered`)
    for (const id of terminal.keys()) {
      if (!accepted.has(id)) violations.push(`${sender.name}: terminal event for ${id}, which it never accepted`)
    }
  }

  for (const receiver of loaded) {
    const seen = new Map()
    for (const row of receiver.app.inbox) {
      const from = byAddress.get(row.sender)
      if (!from) {
        violations.push(`${receiver.name}: inbox row ${row.id} from an unknown sender ${row.sender}`)
        continue
      }
      checkContent(receiver, from, row, ids.get(from).get(row.id), sent.get(from), violations)
      // One content per send: the same content under two ids is a message delivered twice.
      if (seen.has(row.content)) {
        totals.duplicates++
        violations.push(`${receiver.name}: "${row.content}" delivered twice (${seen.get(row.content)}, ${row.id})`)
      }
      seen.set(row.content, row.id)
    }
    totals.redeliveriesAbsorbed += receiver.app.offers.reduce((sum, o) => sum + o.n - 1, 0)
    const inboxIds = new Set(receiver.app.inbox.map((r) => r.id))
    const receivedEvents = new Map()
    for (const r of receiver.records) {
      if (r.t === 'received') receivedEvents.set(r.id, (receivedEvents.get(r.id) ?? 0) + 1)
    }
    for (const [id, n] of receivedEvents) {
      totals.receivedEvents++
      // Inbound dedup (docs/delivery.md#inbound-dedup): a redelivery after a restart is recognised
      // and not dispatched again.
      if (n > 1) violations.push(`${receiver.name}: message_received ${n} times for ${id}`)
      if (!inboxIds.has(id)) violations.push(`${receiver.name}: message_received for ${id}, which the hook never committed`)
    }
    totals.receivedEventsCut += [...inboxIds].filter((id) => !receivedEvents.has(id)).length
  }
  return { totals, perPeer, violations }
}

/**
 * An inbox row holds what its sender sent under that id: the row's id is the wire id of one of
 * the sender's messages, and its content is that send's (`<name>:<seq>`). A minted id whose
 * sendMessage a kill cut short is in the sender's storage but not in its log: its content must
 * then be that of a send that never resolved and whose id the log does not know.
 */
function checkContent(receiver, from, row, id, { intents, outcomes, byId }, violations) {
  const where = `${receiver.name}: inbox row ${row.id} from ${from.name}`
  if (id === undefined || !(from.engine.settled.has(id) || from.engine.outbox.has(id))) {
    violations.push(`${where}, which ${from.name} never accepted`)
    return
  }
  const seq = byId.get(id)?.seq
  if (seq !== undefined) {
    if (row.content !== `${from.name}:${seq}`) violations.push(`${where} holds "${row.content}", but ${id} was sent as "${from.name}:${seq}"`)
    return
  }
  const match = /^(.*):(\d+)$/.exec(row.content)
  const intent = match?.[1] === from.name ? intents.get(Number(match[2])) : undefined
  if (intent === undefined || outcomes.has(intent.seq) || intent.id !== undefined) {
    violations.push(`${where} holds "${row.content}", which is not the content of a send of ${from.name}'s that a kill cut short`)
  }
}

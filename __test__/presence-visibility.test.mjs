// `Relay.start({ presenceVisibility })` (docs/protocol.md#presence-visibility): under 'contacts'
// an account that never exchanged a message with another sees it offline; under the default,
// 'everyone', it sees it online. Raw relay connections, so nothing but the option differs.
import test from 'node:test'
import assert from 'node:assert/strict'
import WebSocket from 'ws'
import { startRelay, token } from './helpers.mjs'

/** The next frame of `type` on `ws`, within a deadline. */
function nextFrame(ws, type, timeoutMs = 10_000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      ws.off('message', onMessage)
      reject(new Error(`no ${type} within ${timeoutMs} ms`))
    }, timeoutMs)
    function onMessage(data) {
      const frame = JSON.parse(data.toString())
      if (frame.type !== type) return
      clearTimeout(timer)
      ws.off('message', onMessage)
      resolve(frame)
    }
    ws.on('message', onMessage)
  })
}

async function authenticated(t, url, account) {
  const ws = new WebSocket(url)
  t.after(() => ws.terminate())
  await new Promise((resolve, reject) => {
    ws.once('open', resolve)
    ws.once('error', reject)
  })
  const answered = nextFrame(ws, 'Authenticated')
  ws.send(JSON.stringify({ type: 'Authenticate', token: token(account) }))
  await answered
  return ws
}

async function bobAsSeenByAlice(t, options) {
  const relay = await startRelay(t, options)
  await authenticated(t, relay.url, 'bob')
  const alice = await authenticated(t, relay.url, 'alice')
  const status = nextFrame(alice, 'PresenceStatus')
  alice.send(JSON.stringify({ type: 'CheckPresence', username: 'bob' }))
  return status
}

test('under the default visibility a stranger sees an online account online', async (t) => {
  const status = await bobAsSeenByAlice(t, {})
  assert.equal(status.online, true)
})

test("under presenceVisibility 'contacts' a stranger sees an online account offline", async (t) => {
  const status = await bobAsSeenByAlice(t, { presenceVisibility: 'contacts' })
  assert.deepEqual({ online: status.online, lastSeen: status.last_seen }, { online: false, lastSeen: undefined })
})

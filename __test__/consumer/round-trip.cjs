// Run inside a project that installed the packed tarballs, by `require`: two devices send a
// sealed message through the relay at argv[2], whose token secret is in the file argv[3].
const { readFileSync } = require('node:fs')
const { join } = require('node:path')
const { tmpdir } = require('node:os')
const { mkdtempSync } = require('node:fs')
const { Protocol, issueToken } = require('offline-courier')

const [url, secretFile] = process.argv.slice(2)
const secret = readFileSync(secretFile, 'utf8')
const dir = mkdtempSync(join(tmpdir(), 'consumer-'))

function device(name) {
  const protocol = new Protocol({
    appId: 'consumer',
    storage: { path: join(dir, `${name}.db`) },
    transports: { internet: { url, authToken: () => issueToken(secret, name) } },
  })
  const events = []
  const waiters = new Set()
  protocol.onEvent((e) => {
    events.push(e)
    for (const w of [...waiters]) w(e)
  })
  const next = (what, predicate) =>
    new Promise((resolve, reject) => {
      const found = events.find(predicate)
      if (found) return resolve(found)
      const timer = setTimeout(() => reject(new Error(`${name}: timed out waiting for ${what}`)), 20_000)
      const check = (e) => {
        if (!predicate(e)) return
        clearTimeout(timer)
        waiters.delete(check)
        resolve(e)
      }
      waiters.add(check)
    })
  return { protocol, next }
}

async function main() {
  const bob = device('bob')
  const alice = device('alice')
  await bob.protocol.start()
  await alice.protocol.start()
  await bob.next('bob online', (e) => e.type === 'internet_status_changed' && e.connected)
  const id = await alice.protocol.sendMessage(bob.protocol.localAddress(), 'hello from a registry install')
  const received = await bob.next('the message', (e) => e.type === 'message_received' && e.messageId === id)
  await alice.next('delivery', (e) => e.type === 'message_delivered' && e.messageId === id)
  await alice.protocol.stop()
  await bob.protocol.stop()
  console.log(JSON.stringify({ content: received.content, encrypted: received.encrypted }))
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})

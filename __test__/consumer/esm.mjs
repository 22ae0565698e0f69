// Run inside a project that installed the packed tarballs, by `import`: named and default
// exports are the same objects as `require` gives.
import { createRequire } from 'node:module'
import courier, { Protocol, ProtocolError, Relay, Gateway, issueToken } from 'offline-courier'

const cjs = createRequire(import.meta.url)('offline-courier')
const same = [Protocol, ProtocolError, Relay, Gateway, issueToken].every((value, i) => value === Object.values(cjs)[i])
const relay = await Relay.start({ listen: '127.0.0.1:0', storage: { memory: true }, jwtSecret: 'esm-secret-0123456789abcdef-012345' })
await relay.stop()
let code
try {
  new Protocol({ appId: 'x', storage: { memory: true }, bogus: 1 })
} catch (e) {
  code = e instanceof ProtocolError ? e.code : 'not a ProtocolError'
}
console.log(JSON.stringify({ same, sameDefault: courier === cjs, relayUrl: relay.url.startsWith('ws://127.0.0.1:'), code }))

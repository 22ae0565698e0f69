// A CommonJS consumer, resolving the package by name through the `exports` map (`require`
// condition: `js/index.d.ts`).
import courier = require('offline-courier')

export async function cjs(): Promise<void> {
  await using relay = await courier.Relay.start({ storage: { memory: true }, jwtSecret: 's3cret-0123456789abcdef-0123456789' })
  const protocol = new courier.Protocol({ appId: 'chat', storage: { memory: true }, transports: { internet: { url: relay.url, authToken: 't' } } })
  protocol.on('message_failed', (ev) => console.log(ev.reason))
}

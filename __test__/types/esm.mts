// An ES module consumer, resolving the package by name through the `exports` map (`import`
// condition: `js/index.d.mts`).
import courier, { Protocol, ProtocolError, type ProtocolEventOf } from 'offline-courier'

export async function esm(): Promise<string> {
  await using protocol = new courier.Protocol({ appId: 'chat', storage: { memory: true } })
  const same: Protocol = protocol
  const ready: ProtocolEventOf<'identity_ready'> = await same.once('identity_ready')
  const error: ProtocolError = new courier.ProtocolError('ERR_ABORTED', 'aborted')
  return `${ready.address} ${error.code}`
}

'use strict'
// The identity seal key at rest: encrypted by the OS keychain through Electron's `safeStorage`
// (Keychain on macOS, DPAPI on Windows, the Secret Service or KWallet on Linux) and kept in a
// file under userData. Main process only: `safeStorage` exists nowhere else. It uses the
// asynchronous calls: Electron 45 deprecates `encryptString` / `decryptString`.

const fs = require('node:fs')
const path = require('node:path')
const { safeStorage } = require('electron')

/**
 * Refuses to run without real OS encryption: a seal key that anyone who can read userData can
 * decrypt would seal nothing. Call after `app.whenReady()`.
 */
async function checkEncryption() {
  if (!(await safeStorage.isAsyncEncryptionAvailable())) {
    throw new Error('safeStorage has no OS encryption available, so the identity seal key cannot be stored safely')
  }
  // A Linux desktop with no secret store to use: the encryption would rest on a key built
  // into Chromium.
  if (process.platform === 'linux' && safeStorage.getSelectedStorageBackend() === 'basic_text') {
    throw new Error(
      'safeStorage found no secret store (GNOME Keyring, KWallet…), so it would encrypt the seal key with a ' +
        'key anyone can know. Start a secret service, or pick one with --password-store=gnome-libsecret or kwallet6.',
    )
  }
}

/** `{ read, write }` over `<userData>/identity-seal-key.bin`, as `startCourier` takes it. */
async function safeStorageKeyStore(userData) {
  await checkEncryption()
  const file = path.join(userData, 'identity-seal-key.bin')

  async function write(key) {
    const sealed = await safeStorage.encryptStringAsync(Buffer.from(key).toString('base64'))
    // The only copy of the key: on disk (fsync) under a temporary name, then renamed, so a
    // crash leaves either the previous file or the whole new one.
    const temporary = `${file}.tmp`
    const fd = fs.openSync(temporary, 'w', 0o600)
    try {
      fs.writeSync(fd, sealed)
      fs.fsyncSync(fd)
    } finally {
      fs.closeSync(fd)
    }
    fs.renameSync(temporary, file)
  }

  async function read() {
    let sealed
    try {
      sealed = fs.readFileSync(file)
    } catch (e) {
      if (e.code === 'ENOENT') return null
      throw e
    }
    const { result, shouldReEncrypt } = await safeStorage.decryptStringAsync(sealed)
    const key = Buffer.from(result, 'base64')
    // The OS rotated its key (or offers a stronger one): seal ours again under it.
    if (shouldReEncrypt) await write(key)
    return key
  }

  return { read, write }
}

module.exports = { safeStorageKeyStore }

'use strict'
// The identity seal key at rest: encrypted by the OS keychain through Electron's `safeStorage`
// (Keychain on macOS, DPAPI on Windows, the Secret Service or KWallet on Linux) and kept in a
// file under userData. Main process only: `safeStorage` exists nowhere else.

const fs = require('node:fs')
const path = require('node:path')
const { safeStorage } = require('electron')

/**
 * Refuses to run without real OS encryption: a seal key that anyone who can read userData can
 * decrypt would seal nothing. Call after `app.whenReady()` (before it, Linux reports none).
 */
function checkEncryption() {
  if (!safeStorage.isEncryptionAvailable()) {
    throw new Error('safeStorage has no OS encryption available, so the identity seal key cannot be stored safely')
  }
  // Linux without a secret store falls back to a password hardcoded in Chromium.
  if (process.platform === 'linux' && safeStorage.getSelectedStorageBackend() === 'basic_text') {
    throw new Error(
      'safeStorage found no secret store (GNOME Keyring, KWallet…), so it would "encrypt" the seal key with a ' +
        'hardcoded password. Start a secret service, or pick one with --password-store=gnome-libsecret or kwallet6.',
    )
  }
}

/** `{ read, write }` over `<userData>/identity-seal-key.bin`, as `startCourier` takes it. */
function safeStorageKeyStore(userData) {
  checkEncryption()
  const file = path.join(userData, 'identity-seal-key.bin')
  return {
    read() {
      let sealed
      try {
        sealed = fs.readFileSync(file)
      } catch (e) {
        if (e.code === 'ENOENT') return null
        throw e
      }
      return Buffer.from(safeStorage.decryptString(sealed), 'base64')
    },
    write(key) {
      // The only copy of the key: on disk (fsync) under a temporary name, then renamed, so a
      // crash leaves either no key file or a whole one.
      const temporary = `${file}.tmp`
      const fd = fs.openSync(temporary, 'w', 0o600)
      try {
        fs.writeSync(fd, safeStorage.encryptString(Buffer.from(key).toString('base64')))
        fs.fsyncSync(fd)
      } finally {
        fs.closeSync(fd)
      }
      fs.renameSync(temporary, file)
    },
  }
}

module.exports = { safeStorageKeyStore }

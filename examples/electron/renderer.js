'use strict'
// The page: it knows only `window.courier` (preload.js).

const events = document.getElementById('events')
const form = document.getElementById('send')
const to = document.getElementById('to')
const text = document.getElementById('text')

function show(type, details) {
  const item = document.createElement('li')
  item.textContent = `${new Date().toLocaleTimeString()} ${type} ${JSON.stringify(details)}`
  events.prepend(item)
}

window.courier.onAddress((address) => {
  document.getElementById('address').textContent = address
})
window.courier.onEvent(({ type, ...details }) => show(type, details))

form.addEventListener('submit', async (submit) => {
  submit.preventDefault()
  try {
    const messageId = await window.courier.send(to.value.trim(), text.value)
    show('queued', { messageId })
    text.value = ''
  } catch (e) {
    show('refused', { reason: e.message })
  }
})

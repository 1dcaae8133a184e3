// Drives the web page's client (gateway/web/chat.js) against a running gateway, as the page does:
// node web_client.mjs BASE KEY MESSAGE... prints {"replies", "events", "history", "unknown", "listed",
// "linked", "downloads"}
// (a MESSAGE "photo:TEXT" is TEXT sent with a 1x1 PNG)
// as JSON ("unknown": the HTTP status the history of a conversation that does not exist gets;
// "listed": whether the conversation, named after its first message as the page names it, is the
// newest one listed, and its title;
// "linked": the files `message` events linked; "downloads": the name, type and text of each, fetched
// as the page does).
import { ApiError, Client, sizeOf, titleOf } from "../../gateway/web/chat.js";

const PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNoAAAAggCBd81ytgAAAABJRU5ErkJggg==";

const [base, key, ...messages] = process.argv.slice(2);
const client = new Client(base, key);
const conversation = await client.newConversation();
const stop = new AbortController();
const events = [];
const linked = [];
let finished = 0;
const following = (async () => {
  try {
    for await (const { event, data } of client.events(conversation, stop.signal, "0")) {
      events.push(event);
      if (event === "message") linked.push(...(data.files ?? []));
      if (event === "run.finished" && ++finished === messages.length) return;
    }
  } catch (err) {
    if (!stop.signal.aborted) throw err;
  }
})();
const sent = messages.map((m) => (m.startsWith("photo:") ? { text: m.slice(6), images: [PNG] } : { text: m, images: [] }));
const replies = [];
for (const { text, images } of sent) replies.push(await client.chat(conversation, text, images));
const deadline = setTimeout(() => stop.abort(), 20000);
await following;
clearTimeout(deadline);
stop.abort();
const history = await client.history(conversation);
await client.rename(conversation, titleOf(sent[0].text, sent[0].images.length));  // as the page does
const [newest] = await client.conversations();
const listed = { mine: newest.conversationId === conversation, title: newest.title };
const unknown = await client.history("no-such-conversation").then(() => 200, (err) => (err instanceof ApiError ? err.status : -1));
const downloads = [];
for (const file of linked) {
  const blob = await client.download(file.url);
  downloads.push({ name: file.name, size: sizeOf(file.size), type: blob.type, text: await blob.text() });
}
console.log(JSON.stringify({ replies, events, history, unknown, listed, linked, downloads }));

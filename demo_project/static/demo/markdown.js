// A small, safe Markdown renderer for agent messages: it builds DOM nodes and sets only text
// (textContent, text nodes), never HTML, so whatever an agent sends is shown, not run. The
// subset: paragraphs (single newlines are line breaks), headings, fenced code blocks, bullet and
// numbered lists, block quotes, inline code, bold, italic, and links to http(s) URLs only.

const FENCE = /^\s*(```|~~~)\s*([\w+-]*)\s*$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*\d{1,9}[.)]\s+(.*)$/;
const HEADING = /^(#{1,6})\s+(.*?)\s*#*\s*$/;
const QUOTE = /^\s*>\s?(.*)$/;
// One inline construct at a time, leftmost first: code, bold, italic, a link.
const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|__(?=\S)([\s\S]*?\S)__|\*(?=[^\s*])([\s\S]*?[^\s*])\*|(?<![\w])_(?=[^\s_])([\s\S]*?[^\s_])_(?![\w])|\[([^\]\n]+)\]\(([^()\s]+)\)/;

/**
 * Render Markdown text into `container` (its children are replaced).
 * @param {string} text
 * @param {HTMLElement} container
 */
export function renderMarkdown(text, container) {
  container.replaceChildren(...blocks(String(text).replace(/\r\n?/g, "\n").split("\n")));
}

/** @param {string[]} lines @returns {Node[]} */
function blocks(lines) {
  /** @type {Node[]} */
  const out = [];
  let index = 0;
  while (index < lines.length) {
    const line = lines[index];
    const fence = FENCE.exec(line);
    if (fence) {
      const body = [];
      index += 1;
      while (index < lines.length && !(lines[index].trim().startsWith(fence[1]) && lines[index].trim().replaceAll(fence[1][0], "") === "")) {
        body.push(lines[index]);
        index += 1;
      }
      index += 1; // the closing fence (or the end of the text, while a message still streams in)
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      if (fence[2]) code.dataset.language = fence[2];
      code.textContent = body.join("\n");
      pre.append(code);
      out.push(pre);
      continue;
    }
    if (line.trim() === "") {
      index += 1;
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      // h1/h2 would shout inside a chat bubble: levels start at h3
      const element = document.createElement(`h${Math.min(heading[1].length + 2, 6)}`);
      element.append(...inline(heading[2]));
      out.push(element);
      index += 1;
      continue;
    }
    const listKind = BULLET.test(line) ? BULLET : NUMBERED.test(line) ? NUMBERED : null;
    if (listKind) {
      const list = document.createElement(listKind === BULLET ? "ul" : "ol");
      while (index < lines.length && listKind.test(lines[index])) {
        const item = document.createElement("li");
        item.append(...inline(/** @type {RegExpExecArray} */ (listKind.exec(lines[index]))[1]));
        list.append(item);
        index += 1;
      }
      out.push(list);
      continue;
    }
    if (QUOTE.test(line)) {
      const quoted = [];
      while (index < lines.length && QUOTE.test(lines[index])) {
        quoted.push(/** @type {RegExpExecArray} */ (QUOTE.exec(lines[index]))[1]);
        index += 1;
      }
      const quote = document.createElement("blockquote");
      quote.append(...blocks(quoted));
      out.push(quote);
      continue;
    }
    const paragraph = document.createElement("p");
    let first = true;
    while (
      index < lines.length &&
      lines[index].trim() !== "" &&
      !FENCE.test(lines[index]) &&
      !HEADING.test(lines[index]) &&
      !BULLET.test(lines[index]) &&
      !NUMBERED.test(lines[index]) &&
      !QUOTE.test(lines[index])
    ) {
      if (!first) paragraph.append(document.createElement("br"));
      paragraph.append(...inline(lines[index]));
      first = false;
      index += 1;
    }
    out.push(paragraph);
  }
  return out;
}

/** @param {string} text @returns {Node[]} */
function inline(text) {
  /** @type {Node[]} */
  const out = [];
  let rest = text;
  for (let match = INLINE.exec(rest); match; match = INLINE.exec(rest)) {
    if (match.index > 0) out.push(document.createTextNode(rest.slice(0, match.index)));
    const [whole, , code, bold, boldUnderscore, italic, italicUnderscore, label, href] = match;
    if (code !== undefined) {
      const element = document.createElement("code");
      element.textContent = code.length > 1 && code.startsWith(" ") && code.endsWith(" ") ? code.slice(1, -1) : code;
      out.push(element);
    } else if (bold !== undefined || boldUnderscore !== undefined) {
      const element = document.createElement("strong");
      element.append(...inline(bold ?? boldUnderscore));
      out.push(element);
    } else if (italic !== undefined || italicUnderscore !== undefined) {
      const element = document.createElement("em");
      element.append(...inline(italic ?? italicUnderscore));
      out.push(element);
    } else if (label !== undefined) {
      out.push(link(label, href, whole));
    }
    rest = rest.slice(match.index + whole.length);
  }
  if (rest) out.push(document.createTextNode(rest));
  return out;
}

/** A link only to http(s); anything else (javascript:, data:, relative) stays plain text. */
function link(label, href, whole) {
  let url;
  try {
    url = new URL(href);
  } catch {
    return document.createTextNode(whole);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return document.createTextNode(whole);
  const anchor = document.createElement("a");
  anchor.href = url.href;
  anchor.rel = "noopener noreferrer nofollow";
  anchor.target = "_blank";
  anchor.append(...inline(label));
  return anchor;
}

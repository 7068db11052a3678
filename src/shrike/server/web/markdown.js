// A small Markdown renderer for model answers. Safe by construction: the text is HTML-escaped first and
// only the tags below are ever produced; links are kept only for http(s) and mailto addresses.
"use strict";

const Markdown = (() => {
  function escapeHtml(text) {
    return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
  }

  // Inline spans of one escaped line: `code`, **bold**, *italic* / _italic_, ~~strike~~, [text](url).
  function inline(escaped) {
    const codes = [];
    let out = escaped.replace(/`([^`]+)`/g, (_, code) => {
      codes.push(code);
      return `\u0000${codes.length - 1}\u0000`;
    });
    out = out.replace(/\[([^\]]+)\]\(((?:https?:\/\/|mailto:)[^\s)]+)\)/g,
      (_, label, url) => `<a href="${url}" target="_blank" rel="noopener noreferrer">${label}</a>`);
    out = out.replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
      .replace(/(^|\W)_([^_\s][^_]*)_(?=\W|$)/g, "$1<em>$2</em>")
      .replace(/~~([^~]+)~~/g, "<del>$1</del>");
    return out.replace(/\u0000(\d+)\u0000/g, (_, i) => `<code>${codes[Number(i)]}</code>`);
  }

  function render(source) {
    const lines = source.replace(/\r\n?/g, "\n").split("\n");
    const html = [];
    let paragraph = [];
    let list = null; // "ul" or "ol"

    const flushParagraph = () => {
      if (paragraph.length) html.push(`<p>${paragraph.map(inline).join("<br>")}</p>`);
      paragraph = [];
    };
    const closeList = () => {
      if (list) html.push(`</${list}>`);
      list = null;
    };

    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      const fence = line.match(/^\s*(```|~~~)\s*([\w+#.-]*)\s*$/);
      if (fence) {
        flushParagraph();
        closeList();
        const body = [];
        i++;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
        // An unclosed fence (the answer is still streaming) shows as a code block all the same.
        const lang = fence[2] ? `<span class="lang">${escapeHtml(fence[2])}</span>` : "";
        html.push(`<pre class="code">${lang}<button class="copy" type="button">Copy</button>` +
                  `<code>${escapeHtml(body.join("\n"))}</code></pre>`);
        continue;
      }
      const escaped = escapeHtml(line);
      const heading = escaped.match(/^(#{1,6})\s+(.*)$/);
      const bullet = escaped.match(/^\s*[-*+]\s+(.*)$/);
      const numbered = escaped.match(/^\s*\d+[.)]\s+(.*)$/);
      const quote = escaped.match(/^&gt;\s?(.*)$/);
      if (!line.trim()) {
        flushParagraph();
        closeList();
      } else if (heading) {
        flushParagraph();
        closeList();
        const level = Math.min(heading[1].length + 2, 6); // inside a message, h1 is too loud
        html.push(`<h${level}>${inline(heading[2])}</h${level}>`);
      } else if (bullet || numbered) {
        flushParagraph();
        const kind = bullet ? "ul" : "ol";
        if (list !== kind) {
          closeList();
          html.push(`<${kind}>`);
          list = kind;
        }
        html.push(`<li>${inline((bullet || numbered)[1])}</li>`);
      } else if (quote) {
        flushParagraph();
        closeList();
        html.push(`<blockquote>${inline(quote[1])}</blockquote>`);
      } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
        flushParagraph();
        closeList();
        html.push("<hr>");
      } else {
        closeList();
        paragraph.push(escaped);
      }
    }
    flushParagraph();
    closeList();
    return html.join("");
  }

  return { render, escapeHtml };
})();

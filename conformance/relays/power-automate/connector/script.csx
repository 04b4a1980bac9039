// hitl/v0 signer: custom code for a Power Automate custom connector (see ../README.md).
//
// Power Automate has no HMAC expression, so the flow calls this connector twice:
//   VerifyDispatch       before anything is shown to a human: parse X-Draftcat-Signature,
//                        check the ±300 s window, compare the HMAC in constant time, check
//                        payload_hash = sha256(draft.body); returns the verified fields.
//   SignAndPostDecision  builds the decision JSON, signs those exact bytes and POSTs them to
//                        callback.url itself, so the signed bytes are the sent bytes.
// The shared secret is the connection's API key: the platform adds it as the X-Hitl-Secret
// header of every call; it never appears in the flow definition and is never forwarded.
// Only namespaces from the custom-code allow list are used (System.Security.Cryptography,
// System.Text, System.Net.Http, Newtonsoft.Json...); the runtime limit is 5 s per call.
public class Script : ScriptBase
{
    private const long MaxSkewSeconds = 300;
    private const string SecretHeader = "X-Hitl-Secret";
    private static readonly Regex Hex64 = new Regex("^[0-9a-fA-F]{64}$");
    private static readonly Regex Digits = new Regex("^[0-9]{1,20}$");

    public override async Task<HttpResponseMessage> ExecuteAsync()
    {
        try
        {
            if (Context.OperationId == "VerifyDispatch")
            {
                return await VerifyDispatch().ConfigureAwait(false);
            }
            if (Context.OperationId == "SignAndPostDecision")
            {
                return await SignAndPostDecision().ConfigureAwait(false);
            }
            return Reply(HttpStatusCode.BadRequest, new JObject { ["error"] = "unknown operation " + Context.OperationId });
        }
        catch (ArgumentException e)
        {
            return Reply(HttpStatusCode.BadRequest, new JObject { ["error"] = e.Message });
        }
    }

    // ---- VerifyDispatch: {"signature": header value, "body": the dispatch body as text} ----------

    private async Task<HttpResponseMessage> VerifyDispatch()
    {
        JObject input = ParseObject(await Context.Request.Content.ReadAsStringAsync().ConfigureAwait(false));
        string header = (string)input["signature"];
        string raw = (string)input["body"] ?? "";
        long now = DateTimeOffset.UtcNow.ToUnixTimeSeconds();
        string reason = CheckSignature(header, Encoding.UTF8.GetBytes(raw), new[] { Secret() }, now, MaxSkewSeconds);
        if (reason != null)
        {
            return Verdict(reason, null);
        }
        JObject envelope;
        try
        {
            envelope = ParseObject(raw);
        }
        catch (ArgumentException)
        {
            return Verdict("invalid_json", null);
        }
        if ((string)envelope["protocol"] != "hitl/v0")
        {
            return Verdict("invalid_protocol", null);
        }
        string body = (string)envelope.SelectToken("draft.body");
        string payloadHash = (string)envelope["payload_hash"];
        if (body == null || payloadHash != PayloadHash(body))
        {
            return Verdict("payload_hash_mismatch", null);  // show a human only the hashed draft
        }
        var fields = new JObject
        {
            ["approval_id"] = envelope["approval_id"],
            ["nonce"] = envelope.SelectToken("callback.nonce"),
            ["callback_url"] = envelope.SelectToken("callback.url"),
            ["payload_hash"] = payloadHash,
            ["pipeline"] = envelope["pipeline"],
            ["step"] = envelope["step"],
            ["risk"] = envelope["risk"],
            ["expires_at"] = envelope["expires_at"],
            ["revision"] = envelope["revision"],
            ["quorum_required"] = envelope.SelectToken("quorum.required"),
            ["approvers"] = envelope["approvers"],
            ["draft_body"] = body,
            ["draft_content_type"] = envelope.SelectToken("draft.content_type"),
        };
        return Verdict(null, fields);
    }

    // Returns null when the header is valid for body at time now, else the SPEC §2 reason
    // (checks 2-4, in the gate's order; any v1 may match any secret: rotation).
    public static string CheckSignature(string header, byte[] body, IList<string> secrets, long now,
                                        long maxSkew)
    {
        if (header == null || header.Trim().Length == 0)
        {
            return "signature_missing";
        }
        long t = -1;
        string tSent = null;  // the HMAC covers t exactly as sent (a leading zero included)
        var candidates = new List<string>();
        foreach (string part in header.Split(','))
        {
            if (part.Trim().Length == 0)
            {
                continue;
            }
            int eq = part.IndexOf('=');
            if (eq < 0)
            {
                return "signature_malformed";
            }
            string key = part.Substring(0, eq).Trim();
            string value = part.Substring(eq + 1).Trim();
            if (key == "t")
            {
                if (t >= 0 || !Digits.IsMatch(value))
                {
                    return "signature_malformed";
                }
                tSent = value;
                t = 0;
                foreach (char c in value.Length > 18 ? "999999999999999999" : value)
                {
                    t = t * 10 + (c - '0');  // > 18 digits: far future, refused by the window
                }
            }
            else if (key == "v1")
            {
                // a v1 that is not 64 hex digits is skipped: any one v1 matching is enough
                if (Hex64.IsMatch(value))
                {
                    candidates.Add(value.ToLowerInvariant());
                }
            }
        }
        if (t < 0 || candidates.Count == 0)  // no t, or no well-formed v1 at all
        {
            return "signature_malformed";
        }
        if (Math.Abs(now - t) > maxSkew)  // the window first, as the gate does
        {
            return "timestamp_out_of_window";
        }
        bool ok = false;
        foreach (string secret in secrets)
        {
            string expected = Hmac(secret, tSent, body);
            foreach (string candidate in candidates)
            {
                ok |= FixedTimeEquals(expected, candidate);  // no early exit
            }
        }
        return ok ? null : "signature_mismatch";
    }

    // ---- SignAndPostDecision ---------------------------------------------------------------------
    // {"callback_url", "approval_id", "nonce", "payload_hash", "decision": approve|skip|adjust,
    //  "approver_id", "approver_display", "adjust_text"}  ->  the gate's answer, passed through.

    private async Task<HttpResponseMessage> SignAndPostDecision()
    {
        JObject input = ParseObject(await Context.Request.Content.ReadAsStringAsync().ConfigureAwait(false));
        string verb = Required(input, "decision");
        if (verb != "approve" && verb != "skip" && verb != "adjust")
        {
            throw new ArgumentException("decision must be approve, skip or adjust");
        }
        string adjustText = (string)input["adjust_text"];
        if (verb == "adjust" && string.IsNullOrWhiteSpace(adjustText))
        {
            throw new ArgumentException("adjust needs adjust_text");
        }
        var url = new Uri(Required(input, "callback_url"));
        if (url.Scheme != "https" && url.Scheme != "http")
        {
            throw new ArgumentException("callback_url must be http(s)");
        }
        string approverId = Required(input, "approver_id");
        var decision = new JObject
        {
            ["protocol"] = "hitl/v0",
            ["approval_id"] = Required(input, "approval_id"),
            ["nonce"] = Required(input, "nonce"),
            ["decision"] = verb,
            ["payload_hash"] = Required(input, "payload_hash"),
            ["approver"] = new JObject
            {
                ["id"] = approverId,
                ["display"] = (string)input["approver_display"] ?? approverId,
                ["channel"] = "teams",
            },
            ["adjust_text"] = verb == "adjust" ? adjustText : null,
            ["decided_at"] = DateTime.UtcNow.ToString("yyyy-MM-dd'T'HH:mm:ss'Z'"),
        };
        byte[] bytes = Encoding.UTF8.GetBytes(decision.ToString(Formatting.None));  // no BOM
        long t = DateTimeOffset.UtcNow.ToUnixTimeSeconds();
        var request = new HttpRequestMessage(HttpMethod.Post, url) { Content = new ByteArrayContent(bytes) };
        request.Content.Headers.ContentType = new MediaTypeHeaderValue("application/json") { CharSet = "utf-8" };
        request.Headers.TryAddWithoutValidation("X-Hitl-Protocol", "hitl/v0");
        request.Headers.TryAddWithoutValidation("X-Draftcat-Signature",
            "t=" + t.ToString() + ",v1=" + Hmac(Secret(), t.ToString(), bytes));
        return await Context.SendAsync(request, CancellationToken).ConfigureAwait(false);
    }

    // ---- helpers -----------------------------------------------------------------------------------

    public static string Hmac(string secret, string t, byte[] body)
    {
        byte[] prefix = Encoding.ASCII.GetBytes(t + ".");  // t as sent: never re-formatted
        var message = new byte[prefix.Length + body.Length];
        Buffer.BlockCopy(prefix, 0, message, 0, prefix.Length);
        Buffer.BlockCopy(body, 0, message, prefix.Length, body.Length);
        using (var hmac = new HMACSHA256(Encoding.UTF8.GetBytes(secret)))
        {
            return Hex(hmac.ComputeHash(message));
        }
    }

    public static string PayloadHash(string body)
    {
        using (var sha = SHA256.Create())
        {
            return "sha256:" + Hex(sha.ComputeHash(Encoding.UTF8.GetBytes(body)));
        }
    }

    private static string Hex(byte[] bytes)
    {
        return BitConverter.ToString(bytes).Replace("-", "").ToLowerInvariant();
    }

    private static bool FixedTimeEquals(string a, string b)
    {
        if (a.Length != b.Length)
        {
            return false;
        }
        int diff = 0;
        for (int i = 0; i < a.Length; i++)
        {
            diff |= a[i] ^ b[i];
        }
        return diff == 0;
    }

    private string Secret()
    {
        IEnumerable<string> values;
        if (!Context.Request.Headers.TryGetValues(SecretHeader, out values) || string.IsNullOrEmpty(values.FirstOrDefault()))
        {
            throw new ArgumentException("the connection has no secret (" + SecretHeader + ")");
        }
        return values.First();
    }

    // JSON without Newtonsoft's date sniffing: strings stay exactly as sent.
    private static JObject ParseObject(string text)
    {
        try
        {
            using (var reader = new JsonTextReader(new StringReader(text ?? "")))
            {
                reader.DateParseHandling = DateParseHandling.None;
                reader.FloatParseHandling = FloatParseHandling.Decimal;
                return JObject.Load(reader);
            }
        }
        catch (JsonException e)
        {
            throw new ArgumentException("not a JSON object: " + e.Message);
        }
    }

    private static string Required(JObject input, string name)
    {
        string value = (string)input[name];
        if (string.IsNullOrEmpty(value))
        {
            throw new ArgumentException(name + " is required");
        }
        return value;
    }

    private static HttpResponseMessage Verdict(string reason, JObject fields)
    {
        var result = fields ?? new JObject();
        result["valid"] = reason == null;
        result["reason"] = reason;
        return Reply(HttpStatusCode.OK, result);
    }

    private static HttpResponseMessage Reply(HttpStatusCode status, JObject body)
    {
        return new HttpResponseMessage(status) { Content = CreateJsonContent(body.ToString(Formatting.None)) };
    }
}

// Local checks of script.csx outside Power Platform (run.sh builds and runs this with Mono):
//   vectors DIR          known-answer vectors from conformance/vectors/ (signature, header, hash)
//   relay PREFIX ID      a stand-in for the flow: an HttpListener on PREFIX plays the Request
//                        trigger, calls VerifyDispatch, answers 202/401, then approves as ID
//                        through SignAndPostDecision. By default it hands the connector the body
//                        re-serialised from parsed JSON (as @{triggerBody()} would); --as-sent
//                        hands it the received text unchanged.
//   roundtrip            stdin JSON -> exit 0 when parse + re-serialise gives the same text.
// The secret comes from HITL_RELAY_SECRET. Nothing here runs in Power Automate.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Net;
using System.Net.Http;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using Newtonsoft.Json;
using Newtonsoft.Json.Linq;

class FakeContext : IScriptContext
{
    static readonly HttpClient Client = new HttpClient();
    public string CorrelationId { get { return "local-test"; } }
    public string OperationId { get; set; }
    public HttpRequestMessage Request { get; set; }
    public Microsoft.Extensions.Logging.ILogger Logger { get { return null; } }
    public Task<HttpResponseMessage> SendAsync(HttpRequestMessage request, CancellationToken token)
    {
        return Client.SendAsync(request, token);
    }
}

static class Harness
{
    static string Secret = Environment.GetEnvironmentVariable("HITL_RELAY_SECRET") ?? "";

    static int Main(string[] args)
    {
        if (args.Length == 2 && args[0] == "vectors") return Vectors(args[1]);
        if (args.Length >= 3 && args[0] == "relay") return Relay(args[1], args[2], args.Contains("--as-sent"));
        if (args.Length == 1 && args[0] == "roundtrip")
        {
            string text = Console.In.ReadToEnd();
            return Reserialise(text) == text ? 0 : 1;
        }
        Console.Error.WriteLine("usage: vectors DIR | relay PREFIX APPROVER [--as-sent] | roundtrip");
        return 2;
    }

    // What a flow gives the connector for @{triggerBody()}: the parsed JSON written out again.
    static string Reserialise(string text)
    {
        return JToken.Parse(text).ToString(Formatting.None);
    }

    static async Task<Tuple<int, string>> Call(string operation, JObject input)
    {
        var request = new HttpRequestMessage(HttpMethod.Post, "https://connector.invalid/" + operation)
        {
            Content = new StringContent(input.ToString(Formatting.None), Encoding.UTF8, "application/json")
        };
        request.Headers.TryAddWithoutValidation("X-Hitl-Secret", Secret);
        var script = new Script { Context = new FakeContext { OperationId = operation, Request = request } };
        HttpResponseMessage response = await script.ExecuteAsync();
        string body = await response.Content.ReadAsStringAsync();
        return Tuple.Create((int)response.StatusCode, body);
    }

    static byte[] Body(JObject c)
    {
        string hex = (string)c["body_hex"];
        if (hex != null)
        {
            return Enumerable.Range(0, hex.Length / 2).Select(i => Convert.ToByte(hex.Substring(2 * i, 2), 16)).ToArray();
        }
        return Encoding.UTF8.GetBytes((string)c["body_utf8"] ?? "");
    }

    static JObject Load(string dir, string name)
    {
        using (var reader = new JsonTextReader(new StringReader(File.ReadAllText(Path.Combine(dir, name)))))
        {
            reader.DateParseHandling = DateParseHandling.None;
            return JObject.Load(reader);
        }
    }

    static int Vectors(string dir)
    {
        int n = 0, failed = 0;
        foreach (JObject c in Load(dir, "signature.json")["cases"])
        {
            n++;
            string got = "t=" + (long)c["t"] + ",v1=" + Script.Hmac((string)c["secret"], ((long)c["t"]).ToString(), Body(c));
            if (got != (string)c["header"]) { failed++; Console.WriteLine("FAIL signature.json " + c["id"] + ": " + got); }
        }
        foreach (JObject c in Load(dir, "signature_header.json")["cases"])
        {
            n++;
            string got = Script.CheckSignature((string)c["header"], Body(c), c["secrets"].Values<string>().ToList(),
                                               (long)c["now"], (long)c["max_skew"]);
            string want = (bool)c["accepted"] ? null : (string)c["reason"];
            if (got != want) { failed++; Console.WriteLine("FAIL signature_header.json " + c["id"] + ": " + (got ?? "accepted")); }
        }
        foreach (JObject c in Load(dir, "payload_hash.json")["cases"])
        {
            n++;
            string got = Script.PayloadHash((string)c["body"]);
            if (got != (string)c["payload_hash"]) { failed++; Console.WriteLine("FAIL payload_hash.json " + c["id"] + ": " + got); }
        }
        Console.WriteLine((n - failed) + " passed, " + failed + " failed");
        return failed == 0 ? 0 : 1;
    }

    static int Relay(string prefix, string approver, bool asSent)
    {
        var listener = new HttpListener();
        listener.Prefixes.Add(prefix);
        listener.Start();
        Console.WriteLine("stand-in flow listening on " + prefix + (asSent ? " (body as sent)" : " (body re-serialised)"));
        while (true)
        {
            HttpListenerContext context = listener.GetContext();
            Task.Run(() => Handle(context, approver, asSent));
        }
    }

    static async Task Handle(HttpListenerContext context, string approver, bool asSent)
    {
        try
        {
            string text;
            using (var reader = new StreamReader(context.Request.InputStream, new UTF8Encoding(false)))
            {
                text = reader.ReadToEnd();
            }
            var verify = await Call("VerifyDispatch", new JObject
            {
                ["signature"] = context.Request.Headers["X-Draftcat-Signature"],
                ["body"] = asSent ? text : Reserialise(text),
            });
            JObject verdict = JObject.Parse(verify.Item2);
            bool valid = (bool)verdict["valid"];
            // the flow's Response actions: 202 before the human; 401 when the signature is bad,
            // 400 for a signed dispatch it cannot use (flow-definition.json, Refuse_401)
            string reason = (string)verdict["reason"];
            bool signature = reason != null && reason.StartsWith("signature_")
                || reason == "timestamp_out_of_window";
            byte[] answer = Encoding.UTF8.GetBytes(valid ? "{\"status\":\"accepted\"}"
                : "{\"status\":\"" + (signature ? "unauthorized" : "invalid") + "\",\"reason\":\""
                  + reason + "\"}");
            context.Response.StatusCode = valid ? 202 : signature ? 401 : 400;
            context.Response.ContentType = "application/json";
            context.Response.OutputStream.Write(answer, 0, answer.Length);
            context.Response.Close();
            Console.WriteLine("dispatch: " + (valid ? "accepted" : "refused " + verdict["reason"]));
            if (!valid) return;
            var posted = await Call("SignAndPostDecision", new JObject
            {
                ["callback_url"] = verdict["callback_url"],
                ["approval_id"] = verdict["approval_id"],
                ["nonce"] = verdict["nonce"],
                ["payload_hash"] = verdict["payload_hash"],
                ["decision"] = "approve",
                ["approver_id"] = approver,
                ["approver_display"] = approver,
            });
            Console.WriteLine("decision: gate answered " + posted.Item1 + " " + posted.Item2);
        }
        catch (Exception e)
        {
            Console.WriteLine("error: " + e);
        }
    }
}

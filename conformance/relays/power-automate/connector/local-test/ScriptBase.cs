// Stand-ins for the custom-code host (the definitions Microsoft documents for local compilation,
// "Write code in a custom connector"), so script.csx can be compiled and run outside Power Platform.
using System;
using System.Net.Http;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace Microsoft.Extensions.Logging
{
    public interface ILogger { }
}

public interface IScriptContext
{
    string CorrelationId { get; }
    string OperationId { get; }
    HttpRequestMessage Request { get; }
    Microsoft.Extensions.Logging.ILogger Logger { get; }
    Task<HttpResponseMessage> SendAsync(HttpRequestMessage request, CancellationToken cancellationToken);
}

public abstract class ScriptBase
{
    public IScriptContext Context { get; set; }
    public CancellationToken CancellationToken { get; set; }
    public static StringContent CreateJsonContent(string serializedJson)
    {
        return new StringContent(serializedJson, Encoding.UTF8, "application/json");
    }
    public abstract Task<HttpResponseMessage> ExecuteAsync();
}
